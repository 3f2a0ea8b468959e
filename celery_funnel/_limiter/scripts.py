"""Lua scripts shipped as package files, each paired with its Python twin: the one
loader of the package's Lua.

A ``Script`` is loaded once per process (``importlib.resources``), where its caller is
defined; the Redis backend and the stores run its source with EVALSHA (``run_script``),
the memory backend runs its twin against a ``MemoryStore``. Scripts of the Redis stores
(parked tasks, leases, fair queues) have no twin: they run on Redis only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .memstore import MemoryStore

Arg = int | str
Reply = list[int]
Twin = Callable[["MemoryStore", Sequence[str], Sequence[Arg]], Reply]


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, source text, SHA1 and Python twin. A decision script
    also has ``admitted``: a Lua expression, over its reply as a table ``r`` and its
    ``ARGV``, that is true when the decision admits (``_chain`` stops at the first
    false one; the decision's Python decoding must agree, which test_chain checks)."""

    name: str
    source: str
    sha: str
    twin: Twin | None = field(default=None, repr=False, compare=False)
    admitted: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(
        cls,
        name: str,
        twin: Twin | None = None,
        admitted: str | None = None,
        prelude: Sequence[str] = ("_clock",),
    ) -> Script:
        """Read ``celery_funnel/lua/<name>.lua`` from the installed package, after its
        ``prelude`` files (by default ``_clock.lua``, the clock every script uses)."""
        return cls.build(name, source(*prelude, name), twin, admitted)

    @classmethod
    def build(
        cls, name: str, source: str, twin: Twin | None = None, admitted: str | None = None
    ) -> Script:
        """A script of ``source`` text (its SHA1 computed)."""
        return cls(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest(), twin, admitted)

    @property
    def body(self) -> str:
        """The script's own text, without the shared prelude."""
        return _read(self.name)


def _read(name: str) -> str:
    return (
        resources.files("celery_funnel").joinpath("lua").joinpath(f"{name}.lua").read_text("utf-8")
    )


def source(*names: str) -> str:
    """The text of ``celery_funnel/lua/<name>.lua`` for each of ``names``, in order."""
    return "".join(_read(name) for name in names)


Eval = Callable[[Script, Sequence[str], Sequence[Arg]], Reply]
"""How a strategy runs a script: ``eval(script, keys, args) -> reply``."""

Call = tuple[Script, Sequence[str], Sequence[Arg]]
EvalMany = Callable[[Sequence[Call]], list[Reply]]
"""How a batch runs many scripts in one round trip: ``eval_many(calls) -> replies``,
each call atomic on its own, the replies in the calls' order."""


def clock_arg(now_us: int | None) -> Arg:
    """The ``now`` argument of every script: microseconds, or "" for the server's TIME."""
    return "" if now_us is None else now_us


def parse_now(arg: Arg, store: MemoryStore) -> int:
    """Twin side of ``clock_arg``: the given microseconds, else the store's clock."""
    return store.time_us() if arg == "" else int(arg)
