"""The limiting algorithms, one module each: argument building, reply parsing and the
Python twin of the module's Lua script. Each module registers itself by name
(``_registry``); importing this package registers every built-in strategy."""

from . import fixed_window, gcra, sliding_log, sliding_window
from ._registry import SCOPES, Strategy, get, names, register, validate

__all__ = [
    "SCOPES",
    "Strategy",
    "fixed_window",
    "gcra",
    "get",
    "names",
    "register",
    "sliding_log",
    "sliding_window",
    "validate",
]
