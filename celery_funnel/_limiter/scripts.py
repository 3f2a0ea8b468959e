"""Lua scripts shipped as package files, each paired with its Python twin: the one
loader of the package's Lua, and what runs a script on Redis.

A ``Script`` is loaded once per process (``importlib.resources``), where its caller is
defined, and registered with a Redis server at its first NOSCRIPT (as redis-py's
``Lock`` registers its scripts once): the Redis backend and the stores run its source
with EVALSHA (``run_script`` on a ``RedisClient``), the memory backend runs its twin
against a ``MemoryStore``. Scripts of the Redis stores (parked tasks, leases, fair
queues) have no twin: they run on Redis only. A store imports this module, not the
funnel backends.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from .memstore import MemoryStore

Arg = int | str
Reply = list[int]
Twin = Callable[["MemoryStore", Sequence[str], Sequence[Arg]], Reply]
Admits = Callable[[Reply], bool]  # ``admitted`` in Python, over the reply as a list


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, source text, SHA1 and Python twin. A decision script
    also has ``admitted``: a Lua expression, over its reply as a table ``r`` and its
    ``ARGV``, that is true when the decision admits (``_chain`` stops at the first
    false one; the decision's Python decoding must agree, which test_chain checks).
    ``admits`` is its Python twin, over the reply as a list (None: not given; the
    worker gate then decodes the reply the long way). ``body`` is the script's own
    text, without its prelude (what ``_chain`` wraps)."""

    name: str
    source: str
    sha: str
    twin: Twin | None = field(default=None, repr=False, compare=False)
    admitted: str | None = field(default=None, repr=False, compare=False)
    body: str = field(default="", repr=False, compare=False)
    admits: Admits | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(
        cls,
        name: str,
        twin: Twin | None = None,
        admitted: str | None = None,
        prelude: Sequence[str] = ("_clock",),
        directory: str | Path | None = None,
        admits: Admits | None = None,
    ) -> Script:
        """Read ``celery_funnel/lua/<name>.lua`` from the installed package, after its
        ``prelude`` files (by default ``_clock.lua``, the clock every script uses).
        ``directory`` reads ``<name>.lua`` from there instead (a limiter kind kept
        outside the package); the prelude always comes from the package."""
        body = _read(name, directory)
        script = cls.build(name, source(*prelude) + body, twin, admitted, body=body)
        return dataclasses.replace(script, admits=admits) if admits is not None else script

    @classmethod
    def build(
        cls,
        name: str,
        source: str,
        twin: Twin | None = None,
        admitted: str | None = None,
        *,
        body: str | None = None,
    ) -> Script:
        """A script of ``source`` text (its SHA1 computed); ``body``, its own text
        without a prelude (default: all of ``source``)."""
        sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        return cls(name, source, sha, twin, admitted, source if body is None else body)


def _read(name: str, directory: str | Path | None = None) -> str:
    if directory is not None:
        return Path(directory, f"{name}.lua").read_text("utf-8")
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

R_co = TypeVar("R_co", covariant=True)


class Op(Protocol[R_co]):
    """One operation on a store of funnels (a ``ThrottleOp``, ``ReserveOp``,
    ``SettleOp``...): the one script call it makes, its arguments checked (``call``;
    raising ``ConfigurationError`` before anything is sent), and what the reply means
    (``answer``). ``Funnel.decide`` runs any list of them in one round trip."""

    def call(self) -> Call: ...
    def answer(self, reply: Reply) -> R_co: ...


def clock_arg(now_us: int | None) -> Arg:
    """The ``now`` argument of every script: microseconds, or "" for the server's TIME."""
    return "" if now_us is None else now_us


def parse_now(arg: Arg, store: MemoryStore) -> int:
    """Twin side of ``clock_arg``: the given microseconds, else the store's clock."""
    return store.time_us() if arg == "" else int(arg)


class RedisClient(Protocol):
    """What celery-funnel calls on a redis-py client (``Redis``, ``RedisCluster``, a
    Sentinel master's): the commands the funnels and the stores send. redis-py's own
    annotations vary between versions (and between its sync and asyncio clients), so
    replies are ``Any`` here, as redis-py's are."""

    def execute_command(self, *args: Any, **options: Any) -> Any: ...
    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any: ...
    def script_load(self, script: str) -> Any: ...
    def pipeline(self, transaction: bool = ..., shard_hint: Any = ...) -> Any: ...
    def transaction(self, func: Callable[[Any], None], *watches: Any, **kwargs: Any) -> Any: ...
    def ping(self, **kwargs: Any) -> Any: ...
    def time(self, **kwargs: Any) -> Any: ...
    def info(self, section: Any = ..., *args: Any, **kwargs: Any) -> Any: ...
    def delete(self, *names: Any) -> Any: ...
    def get(self, name: Any) -> Any: ...
    def pttl(self, name: Any) -> Any: ...
    def type(self, name: Any) -> Any: ...
    def hgetall(self, name: Any) -> Any: ...
    def hdel(self, name: Any, *keys: Any) -> Any: ...
    def lrange(self, name: Any, start: int, end: int) -> Any: ...
    def zrange(self, name: Any, start: int, end: int, *args: Any, **kwargs: Any) -> Any: ...
    def zcard(self, name: Any) -> Any: ...
    def zlexcount(self, name: Any, min: Any, max: Any) -> Any: ...
    def scan_iter(self, match: Any = ..., count: Any = ..., *args: Any, **kwargs: Any) -> Any: ...
    def config_get(self, pattern: Any = ..., *args: Any, **kwargs: Any) -> Any: ...
    def close(self) -> Any: ...


def run_script(
    client: RedisClient, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """``script`` on redis-py ``client`` (a Cluster's too) by EVALSHA, loaded first when
    the server does not have it (NOSCRIPT): what the stores beside the funnels run.

    Raises:
        RedisError: when Redis fails.
    """
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(script.source)
        return client.evalsha(script.sha, len(keys), *keys, *args)
