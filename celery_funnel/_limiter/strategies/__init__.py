"""The limiting algorithms, one module each: argument building, reply parsing and the
Python twin of the module's Lua script. Each module registers itself by name
(``_registry``), its capabilities a row of the literal table ``CAPABILITIES``;
importing this package registers every built-in strategy."""

from . import fixed_window, gcra, sliding_log, sliding_window
from ._registry import (
    CAPABILITIES,
    DEFAULT,
    SCOPES,
    Capabilities,
    Strategy,
    capabilities,
    get,
    names,
    register,
    validate,
)

__all__ = [
    "CAPABILITIES",
    "DEFAULT",
    "SCOPES",
    "Capabilities",
    "Strategy",
    "capabilities",
    "fixed_window",
    "gcra",
    "get",
    "names",
    "register",
    "sliding_log",
    "sliding_window",
    "validate",
]
