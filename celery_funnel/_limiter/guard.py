"""``funnel.limit(...)``: any function, or any block of code, behind a funnel.

What it returns (``LimitGuard``) decorates plain and async functions and is a context
manager (``with``, ``async with``). Each call takes ``cost`` units of the funnel named
``<prefix>{<name>[:<key part>]}``, the key a ``FunnelTask`` of that name with the same
``funnel_key`` uses (``keys.task_key``): a function and a task share a funnel by name.

When the funnel is full: ``on_limit="wait"`` books the call's slot (a GCRA
``reserve``: waiters start in the order they came, each sleeping exactly until its
slot, no polling) and sleeps; ``"raise"`` raises ``Limited``; ``"skip"`` returns None
without calling. A decision is one atomic call on the funnel (``admission.Rule.decide``),
run directly on a ``Funnel`` or awaited on an ``AsyncRedisFunnel``; only the sleeping
differs.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable, Coroutine
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    NoReturn,
    ParamSpec,
    TypedDict,
    TypeVar,
    overload,
)

from .admission import ON_LIMIT, Rule
from .errors import ConfigurationError
from .keys import DEFAULT_PREFIX, task_key
from .limit import KeyFunc, parse_limit
from .rate import Rate
from .values import check_fields, did_you_mean, number

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

__all__ = ["ON_LIMIT", "LimitGuard", "LimitOptions", "limit_method"]

MAX_WAIT_SECONDS = 1e9  # the reservation script's bound on a wait
P = ParamSpec("P")
R = TypeVar("R")
X = TypeVar("X")  # what a refused call returns: None (skip), else nothing (it waits or raises)


def _nothing() -> None:
    """The signature a ``with`` block's key is formatted over: no arguments."""


class LimitGuard(Generic[X]):
    """A limit on calls: what ``Funnel.limit`` returns. Decorate functions with it, or
    enter it (``with`` on a ``Funnel``, ``async with`` on any funnel). See
    ``Funnel.limit`` for the arguments.

    Raises:
        ConfigurationError: for a bad argument, when it is built.
    """

    def __init__(
        self,
        funnel: Any,
        rate: str | Rate,
        *,
        capacity: int = 1,
        key: str | KeyFunc | None = None,
        cost: int | Callable[..., int] = 1,
        strategy: str = "gcra",
        on_limit: str = "wait",
        max_wait: float | None = None,
        name: str | None = None,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        where = f"limit({rate!r})"
        spec = {"rate": rate, "capacity": capacity, "key": key, "cost": cost, "strategy": strategy}
        self.limit = parse_limit(spec, where=where)
        if on_limit not in ON_LIMIT:
            hint = did_you_mean(on_limit, ON_LIMIT) if isinstance(on_limit, str) else ""
            raise ConfigurationError(
                f"{where}: on_limit must be one of {list(ON_LIMIT)}, got {on_limit!r}{hint}"
            )
        if max_wait is not None:
            max_wait = number(f"{where}: max_wait", max_wait, 0.0, MAX_WAIT_SECONDS)
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigurationError(f"{where}: name must be a non-empty string, got {name!r}")
        if not isinstance(prefix, str):
            raise ConfigurationError(f"{where}: prefix must be a string, got {prefix!r}")
        self.funnel, self.on_limit, self.max_wait = funnel, on_limit, max_wait
        self.name, self.prefix = name, prefix
        self._rule = Rule(self.limit, on_limit, max_wait)
        # an AsyncRedisFunnel runs a decision awaited; any other funnel, directly
        self._awaited = inspect.iscoroutinefunction(getattr(funnel, "_run", None))

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R | X]]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R | X]: ...
    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` behind the funnel: each call is admitted (or waits, raises, is skipped)
        before ``fn`` runs.

        Raises:
            ConfigurationError: when ``key`` names a field that is not a parameter of
                ``fn``, or when a plain function is given to an ``AsyncRedisFunnel``.
        """
        name = self.name or f"{fn.__module__}.{fn.__qualname__}"
        self._check_fields(name, fn)
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def limited_async(*args: Any, **kwargs: Any) -> Any:
                if await self._admit_async(name, fn, args, kwargs):
                    return await fn(*args, **kwargs)
                return None

            return limited_async
        self._refuse_blocking(f"a plain function ({name})")

        @functools.wraps(fn)
        def limited(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if self._admit(name, fn, args, kwargs) else None

        return limited

    def __enter__(self) -> None:
        """Wait for (or be refused) one admission before the block runs.

        Raises:
            Limited: with ``on_limit="raise"``, or when the wait would pass ``max_wait``.
            ConfigurationError: on an ``AsyncRedisFunnel`` (use ``async with``), without
                a ``name``, or with ``on_limit="skip"`` (a block cannot be skipped).
        """
        self._refuse_blocking("a with block")
        self._admit(self._block_name(), _nothing, (), {})

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> None:
        """``__enter__``, awaited: the wait is an ``asyncio.sleep``."""
        await self._admit_async(self._block_name(), _nothing, (), {})

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _block_name(self) -> str:
        if self.name is None:
            raise ConfigurationError(
                "a limit used as a context manager needs name=... (its funnel's name)"
            )
        if self.on_limit == "skip":
            raise ConfigurationError(
                "on_limit='skip' cannot skip a with block: decorate a function, or use"
                " on_limit='raise' and catch celery_funnel.Limited"
            )
        return self.name

    def _refuse_blocking(self, what: str) -> None:
        if self._awaited:
            raise ConfigurationError(
                f"an AsyncRedisFunnel limits async functions and async with blocks, not"
                f" {what}: use a RedisFunnel on the same Redis (they share funnels)"
            )

    def _check_fields(self, name: str, fn: Callable[..., Any]) -> None:
        """A key's fields must be parameters of ``fn``: else every call would fail."""
        params = inspect.signature(fn).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            check_fields(f"limit of {name}: key", self.limit.key, list(params), "the function")

    def _key(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> str:
        """The funnel key of one call: a FunnelTask called ``name`` would use it."""
        try:
            part = self.limit.key_part(fn, args, kwargs)
        except KeyError as exc:  # a with block has no arguments to format
            raise ConfigurationError(
                f"limit {name!r}: key {self.limit.key!r} formats {exc} over no arguments:"
                f" in a with block, pass the key's text itself"
            ) from None
        return task_key(self.prefix, name, part)

    def _call(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> tuple[str, int]:
        return self._key(name, fn, args, kwargs), self.limit.cost_of(args, kwargs)

    def _admit(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> bool:
        """Decide (and sleep) until the call may run: True, or False to skip it."""
        key, cost = self._call(name, fn, args, kwargs)
        waited = 0.0
        while True:
            admission = self._rule.decide(key, cost, waited, self.funnel)
            if admission.wait > 0:
                time.sleep(admission.wait)
                waited += admission.wait
            if not admission.again:
                return admission.go

    async def _admit_async(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> bool:
        """``_admit`` for a coroutine: the funnel's round trip and the sleep awaited
        (a blocking ``Funnel``'s round trip is made in place: one call, short)."""
        key, cost = self._call(name, fn, args, kwargs)
        waited = 0.0
        while True:
            decision = functools.partial(self._rule.decide, key, cost, waited)
            admission = await self.funnel._run(decision) if self._awaited else decision(self.funnel)
            if admission.wait > 0:
                await asyncio.sleep(admission.wait)
                waited += admission.wait
            if not admission.again:
                return admission.go


class LimitOptions(TypedDict, total=False):
    """``Funnel.limit``'s options besides ``rate`` and ``on_limit``."""

    capacity: int
    key: str | KeyFunc | None
    cost: int | Callable[..., int]
    strategy: str
    max_wait: float | None
    name: str | None
    prefix: str


@overload
def limit_method(
    self: Any, rate: str | Rate, *, on_limit: Literal["skip"], **options: Unpack[LimitOptions]
) -> LimitGuard[None]: ...
@overload
def limit_method(
    self: Any,
    rate: str | Rate,
    *,
    on_limit: Literal["wait", "raise"] = "wait",
    **options: Unpack[LimitOptions],
) -> LimitGuard[NoReturn]: ...
def limit_method(
    self: Any, rate: str | Rate, *, on_limit: str = "wait", **options: Unpack[LimitOptions]
) -> LimitGuard[Any]:
    """Calls limited by this store's funnels: a decorator (plain and async functions)
    and a context manager (``with`` on a ``Funnel``, ``async with`` on any).

    Args:
        rate: ``"30/m"`` and the like (``Rate.parse``), or a ``Rate``.
        capacity: calls that may start back to back from an idle funnel (GCRA's
            ``max_burst + 1``; window strategies admit ``rate``'s count per window).
        key: splits the funnel: a format string over the decorated function's bound
            arguments (``"{user}"``) or a callable taking the same arguments; in a
            ``with`` block, the key's text itself. None: one funnel.
        cost: units one call takes (an int, or a callable taking the arguments).
        strategy: a registered strategy's name (``strategies.names()``): ``"gcra"``,
            ``"fixed_window"``, ``"sliding_log"``, ``"sliding_window"``, or one registered
            since.
        on_limit: when the funnel is full, ``"wait"`` books the call's slot and sleeps
            until it (waiters go in arrival order; a window strategy sleeps until
            ``retry_after`` and asks again); ``"raise"`` raises ``Limited``;
            ``"skip"`` returns None without calling (not for ``with`` blocks).
        max_wait: seconds a ``"wait"`` may wait at most; a longer wait books nothing
            and raises ``Limited``. None: no bound.
        name: the funnel's name: default ``<module>.<qualified name>`` of the decorated
            function (required for a ``with`` block). A ``FunnelTask`` of that name
            with the same ``funnel_key`` shares the funnel; ``"limit:<pattern>"`` is a
            worker-wide ``funnel_limits`` entry's.
        prefix: the key prefix (the app's ``funnel_key_prefix``, default ``funnel:``).

    The funnel's key is ``<prefix>{<name>}``, or ``<prefix>{<name>:<key part>}``.

    Raises:
        ConfigurationError: for a bad argument (here), or a key naming a field that is
            not a parameter of the decorated function (when decorating).
        Limited: from a call (or block), refused with ``on_limit="raise"``, or when the
            wait would pass ``max_wait``; ``retry_after`` in float seconds.
        CostTooHighError: from a call whose cost can never fit the funnel.
        BackendError: from a call, when the funnels' Redis fails.
    """
    return LimitGuard(self, rate, on_limit=on_limit, **options)
