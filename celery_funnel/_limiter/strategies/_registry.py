"""The strategy registry: each strategy module registers itself here, by name.

A strategy is one module (argument building, reply parsing, the Python twin) and its
Lua script; the limiter and the CLI reach it through this registry only, so adding one
is one module, one script, one ``register`` call and its row in ``CAPABILITIES``. Unknown
names fail with the list of choices (``"fixed-window"`` never silently becomes another
strategy).

What a strategy can do beyond one decision (book a slot, be settled, adapt...) is
declared in the literal table ``CAPABILITIES`` and asked through ``capabilities(name)``:
no code outside a strategy's own module tests a strategy's name.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..decision import Decision, Reservation
from ..errors import ConfigurationError
from ..rate import Rate

__all__ = [
    "CAPABILITIES",
    "DEFAULT",
    "SCOPES",
    "Capabilities",
    "Spec",
    "Strategy",
    "capabilities",
    "get",
    "names",
    "register",
    "validate",
]

SCOPES = ("global", "worker")
DEFAULT = "gcra"  # the strategy of a limit that names none


@dataclass(frozen=True)
class Capabilities:
    """What a strategy's funnels can do beyond one decision (each False by default).

    ``capacity_bound``: a cost above the capacity can never run (else the rate's count
    bounds the cost). ``books``: a refused request books the next slot under a ticket
    (``Funnel.reserve``; its ``Strategy.reserve`` is set) and can give it back.
    ``joint``: several funnels of one task decided in one script, all or nothing
    (``Funnel.reserve_all``): a task may have several limits. ``settles``: a run's units
    settled after it (``funnel_settle``). ``aligns``: brought in line with an upstream's
    quota headers. ``holds``: held by an upstream's Retry-After (``funnel_backoff``).
    ``adapts``: an adaptive rate (``"adaptive"`` in a limit). ``fair_share``: shared fairly
    between tenants (``fair_by``). ``rebases``: moved to a new pace when the limit is
    overridden (``rebase.lua``).
    """

    capacity_bound: bool = False
    books: bool = False
    joint: bool = False
    settles: bool = False
    aligns: bool = False
    holds: bool = False
    adapts: bool = False
    fair_share: bool = False
    rebases: bool = False


NONE = Capabilities()

# Every built-in strategy's capabilities, one row each (a strategy registered later
# brings its own row through ``register``).
CAPABILITIES: dict[str, Capabilities] = {
    "gcra": Capabilities(
        capacity_bound=True, books=True, joint=True, settles=True, aligns=True,
        holds=True, adapts=True, fair_share=True, rebases=True,
    ),
    "fixed_window": NONE,
    "sliding_log": NONE,
    "sliding_window": NONE,
}  # fmt: skip


def capabilities(name: object) -> Capabilities:
    """What strategy ``name`` can do (an unknown name: nothing; ``get`` refuses it)."""
    return CAPABILITIES.get(name, NONE) if isinstance(name, str) else NONE


class Spec(Protocol):
    """What a strategy reads of a limit (``Limit`` has it)."""

    @property
    def rate(self) -> Rate: ...
    @property
    def capacity(self) -> int: ...
    @property
    def windows(self) -> int: ...
    @property
    def strategy(self) -> str: ...
    @property
    def cost(self) -> object: ...
    @property
    def key(self) -> object: ...
    @property
    def scope(self) -> str: ...
    @property
    def pattern(self) -> str | None: ...


# the backend a strategy decides through: ``backends.base.Funnel``, which is built on
# the strategies (imports run one way: backends -> strategies), so not named here
Backend = Any
Decide = Callable[[Backend, str, Spec, int], Decision]
Reserve = Callable[[Backend, str, Spec, int, str, bool, "float | None"], Reservation]


@dataclass(frozen=True)
class Strategy:
    """One registered strategy.

    ``decide(funnel, key, spec, quantity)``: one atomic decision (quantity 0 peeks: the
    funnel's state, nothing taken). ``reserve(funnel, key, spec, quantity, ticket,
    redeem, late)``: book the next slot, for strategies that can (``Capabilities.books``);
    None otherwise. ``check(spec)``: the strategy's own checks of a limit (raising
    ``ConfigurationError``), run when a ``Limit`` is built. What else it can do is its
    row in ``CAPABILITIES``.
    """

    name: str
    decide: Decide
    reserve: Reserve | None = None
    check: Callable[[Spec], None] | None = None

    @property
    def can(self) -> Capabilities:
        """Its row in ``CAPABILITIES``."""
        return capabilities(self.name)

    def bound(self, spec: Spec) -> int:
        """The largest cost that can ever be admitted under ``spec``."""
        return spec.capacity if self.can.capacity_bound else spec.rate.count


_REGISTRY: dict[str, Strategy] = {}


def register(strategy: Strategy, can: Capabilities | None = None) -> Strategy:
    """Add ``strategy`` under its name (a name registered twice is an error), with its
    capabilities ``can`` (a built-in strategy has its row in ``CAPABILITIES`` already)."""
    if strategy.name in _REGISTRY:
        raise ConfigurationError(f"strategy {strategy.name!r} is registered already")
    row = capabilities(strategy.name) if can is None else can
    if row.books != (strategy.reserve is not None):
        raise ConfigurationError(f"strategy {strategy.name!r}: books a slot iff it has reserve")
    if can is not None:  # only once checked: a refused strategy leaves no row behind
        CAPABILITIES[strategy.name] = can
    _REGISTRY[strategy.name] = strategy
    return strategy


def names() -> tuple[str, ...]:
    """Every registered strategy name, in registration order."""
    return tuple(_REGISTRY)


def get(name: object) -> Strategy:
    """The strategy called ``name``.

    Raises:
        ConfigurationError: for an unknown name, with the choices and a close match.
    """
    strategy = _REGISTRY.get(name) if isinstance(name, str) else None
    if strategy is None:
        close = difflib.get_close_matches(str(name).replace("-", "_"), _REGISTRY, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigurationError(
            f"unknown strategy {name!r}: choose one of {list(_REGISTRY)}{hint}"
        )
    return strategy


def _whole(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def validate(spec: Spec) -> Strategy:
    """Check a limit as a whole, in the user's words (``capacity``, ``cost``, ``scope``),
    and return its strategy.

    Raises:
        ConfigurationError: naming the option and its value.
    """
    if not isinstance(spec.rate, Rate):
        raise ConfigurationError(f"rate must be a Rate (Rate.parse('30/m')), got {spec.rate!r}")
    strategy = get(spec.strategy)
    _whole("capacity", spec.capacity, 1)
    if spec.scope not in SCOPES:
        raise ConfigurationError(f"scope must be one of {list(SCOPES)}, got {spec.scope!r}")
    if spec.pattern is None and spec.scope != "global":
        raise ConfigurationError(
            f"scope {spec.scope!r} applies to worker-wide limits (funnel_limits) only;"
            f" a task's own limit is always shared by every worker"
        )
    if spec.key is not None and not (isinstance(spec.key, str) or callable(spec.key)):
        raise ConfigurationError(f"key must be a format string or a callable, got {spec.key!r}")
    if not callable(spec.cost):
        bound = strategy.bound(spec)
        if _whole("cost", spec.cost, 0) > bound:
            what = "capacity" if strategy.can.capacity_bound else "rate's count"
            raise ConfigurationError(
                f"cost {spec.cost} is above the {what} {bound}: such a task could never run"
            )
    if strategy.check is not None:
        strategy.check(spec)
    return strategy
