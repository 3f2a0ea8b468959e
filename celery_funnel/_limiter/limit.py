"""``Limit``: one limit of the limiter layer (rate, capacity, strategy, key, cost), and the
one atomic call that checks it against a funnel backend.

The limiter owns keys and policy; the backend only runs one atomic script call per decision.
"""

from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import strategies
from .errors import ConfigurationError
from .fair import check_fair
from .keys import safe_part
from .rate import Rate
from .strategies._registry import DEFAULT, Backend, capabilities  # Backend: a Funnel
from .strategies.adapt import Adaptive, parse_adaptive
from .strategies.reservation import ReserveOp, Shape
from .values import MAX_CAPACITY, check_plain, did_you_mean, format_fields

__all__ = [
    "Limit",
    "Verdict",
    "check_all",
    "key_part",
    "parse_limit",
    "safe_part",
    "unique_names",
]  # fmt: skip

SCOPES = strategies.SCOPES
OPTIONS = (
    "rate", "capacity", "strategy", "key", "cost", "scope", "windows", "fair_by", "weights",
    "name", "adaptive",
)  # fmt: skip

KeyFunc = Callable[..., object]
CostFunc = Callable[..., int]
Label = Callable[[str], str]  # an option's name as messages show it


class _SafeFormatter(string.Formatter):
    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        value, used = super().get_field(field_name, args, kwargs)
        return check_plain("funnel_key", field_name, value), used

    def format_field(self, value: Any, format_spec: str) -> str:
        return safe_part(super().format_field(value, format_spec))


def select_part(
    key: str | KeyFunc, run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str:
    """What ``key`` (a format string over ``run``'s bound arguments, or a callable
    taking the arguments) selects, made safe for a key."""
    if callable(key):
        return safe_part(check_plain("funnel_key", "key()", key(*args, **kwargs)))
    bound = inspect.signature(run).bind(*args, **kwargs)
    bound.apply_defaults()
    return _SafeFormatter().vformat(key, (), bound.arguments)


class Verdict(NamedTuple):
    """What to do with one task: run it, or wait ``delay`` seconds (a slot ``booked``,
    or not), or fail it because its cost can ``never`` fit."""

    run: bool
    delay: float = 0.0
    booked: bool = False
    never: bool = False
    stale: bool = False
    outage: bool = False  # the funnel's Redis failed: this wait is a back-off
    queued: int = 0  # fair share: 1 join the tenant's waiting queue, 2 in front (_limiter.fair)


def fixed(limit: Limit) -> bool:
    """Whether every run pays ``limit`` alike: one funnel (no key), a cost that is a
    number, no tenants. Such charges are built once per task type."""
    return limit.key is None and not callable(limit.cost) and limit.fair_by is None


def key_part(
    key: str | KeyFunc | None,
    run: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    """The part of a funnel key that ``key`` selects from ``args``/``kwargs`` ("" = one
    funnel, when ``key`` is None)."""
    return "" if key is None else select_part(key, run, args, kwargs)


@dataclass(frozen=True)
class Limit:
    """One limit: ``rate``, burst ``capacity`` (units that may start back to back from an
    idle funnel), ``strategy``, the ``key`` that splits it (a format string over the
    task's arguments, or a callable taking ``*args, **kwargs``), the ``cost`` of one
    task (int or callable), and for worker-wide limits a task-name ``pattern`` and a
    ``scope``; ``name`` names it (unique per task: what ``funnel_settle`` and the
    upstream's feedback address, and what ``status`` and the metrics show)."""

    rate: Rate
    capacity: int = 1
    strategy: str = DEFAULT
    key: str | KeyFunc | None = None
    cost: int | CostFunc = 1
    pattern: str | None = None
    scope: str = "global"
    windows: int = 10
    fair_by: str | KeyFunc | None = None  # fair share between tenants (_limiter.fair)
    weights: Any = None  # the tenants' weights: a mapping or a callable (_limiter.fair)
    name: str | None = None  # unique per task (funnel_settle, feedback, status)
    adaptive: Adaptive | None = None  # the rate adapts to an upstream's 429s (adapt)

    def __post_init__(self) -> None:
        # a Limit built directly is checked as one from parse_limit is, in the same words
        strategies.validate(self)

    def key_part(
        self, run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str:
        """The part of the funnel key that ``args``/``kwargs`` select ("" = one funnel)."""
        return key_part(self.key, run, args, kwargs)

    def cost_of(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
        """Units one task takes."""
        cost = self.cost(*args, **kwargs) if callable(self.cost) else self.cost
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
            raise ConfigurationError(f"funnel_cost must give an integer >= 0, got {cost!r}")
        return cost

    def check(
        self,
        funnel: Backend,
        key: str,
        cost: int,
        *,
        ticket: str | None = None,
        redeem: bool = False,
        late: float | None = None,
    ) -> Verdict:
        """One atomic call on ``funnel``: a reservation (GCRA with a ``ticket``) or a
        plain decision. ``cost`` 0 always runs."""
        if cost == 0:
            return Verdict(run=True)
        strategy = strategies.get(self.strategy)
        reserve = strategy.reserve if ticket is not None else None
        if reserve is None or not redeem:
            # First arrivals try the cheaper plain decision (most are admitted) and
            # book a slot only when refused.
            d = strategy.decide(funnel, key, self, cost)
            never = d.limited and d.retry_after < 0
            if d.allowed or never or reserve is None:
                return Verdict(d.allowed, max(d.retry_after, 0.0), never=never)
        r = reserve(funnel, key, self, cost, ticket or "", redeem, late)
        return Verdict(r.admitted, max(r.delay, 0.0), r.booked, r.never, r.stale)


def check_all(
    funnel: Backend,
    limits: Sequence[Limit],
    keys: Sequence[str],
    costs: Sequence[int],
    *,
    ticket: str | None,
    redeem: bool,
    late: float | None,
) -> Verdict:
    """Several GCRA limits in one atomic call, all or nothing: a reservation under
    ``ticket``, else admit-now-or-refuse. The keys must share a hash slot."""
    shapes = [
        Shape(key, limit.capacity - 1, limit.rate.count, limit.rate.period, cost)
        for limit, key, cost in zip(limits, keys, costs, strict=True)
        if cost > 0
    ]
    if not shapes:
        return Verdict(run=True)
    op = ReserveOp(shapes, ticket, redeem, max_wait=None if ticket else 0, late=late)
    r = funnel.decide([op])[0]
    return Verdict(r.admitted, max(r.delay, 0.0), r.booked, r.never, r.stale)


def _choice(where: str, option: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise ConfigurationError(
            f"{where}: {option} must be one of {list(choices)}, got {value!r}{hint}"
        )
    return str(value)


def _capacity_and_cost(spec: Mapping[str, Any], where: str, label: Label) -> tuple[int, Any]:
    capacity = spec.get("capacity", 1)
    if capacity is None:
        capacity = 1
    if (
        isinstance(capacity, bool)
        or not isinstance(capacity, int)
        or not 1 <= capacity <= MAX_CAPACITY
    ):
        raise ConfigurationError(
            f"{where}: {label('capacity')} must be an integer from 1 to {MAX_CAPACITY:_},"
            f" got {capacity!r}"
        )
    cost = spec.get("cost", 1)
    if cost is None:
        cost = 1
    if not callable(cost) and (isinstance(cost, bool) or not isinstance(cost, int) or cost < 0):
        raise ConfigurationError(
            f"{where}: {label('cost')} must be an integer >= 0 or a callable, got {cost!r}"
        )
    if (
        isinstance(cost, int)
        and cost > capacity
        and capabilities(spec.get("strategy") or DEFAULT).capacity_bound
    ):
        raise ConfigurationError(
            f"{where}: {label('cost')}={cost} is above {label('capacity')}={capacity}:"
            f" it could never run"
        )
    return capacity, cost


def _worker_wide(spec: Mapping[str, Any], where: str) -> None:
    """Worker-wide limits apply to tasks of any signature, one funnel per pattern (and
    per worker with scope "worker"): a key or a cost would be ignored, so refuse them."""
    if spec.get("key") is not None:
        raise ConfigurationError(
            f"{where}: 'key'={spec['key']!r} is not supported in worker-wide limits (one"
            f" funnel per pattern, or per worker with 'scope': 'worker'); to split a funnel"
            f" by arguments, use a FunnelTask with funnel_key=... (or 'key' in its"
            f" funnel_limits)"
        )
    if spec.get("fair_by") is not None or spec.get("weights") is not None:
        raise ConfigurationError(
            f"{where}: 'fair_by'={spec.get('fair_by')!r} is not supported in worker-wide"
            f" limits (tasks of any signature); use a FunnelTask with funnel_fair_by=..."
            f" (or 'fair_by' in its funnel_limits)"
        )
    if spec.get("cost", 1) != 1:
        raise ConfigurationError(
            f"{where}: 'cost'={spec['cost']!r} is not supported in worker-wide limits (each"
            f" task costs 1); to charge more per task, use a FunnelTask with funnel_cost=..."
        )


def _key(spec: Mapping[str, Any], where: str, label: Label) -> str | KeyFunc | None:
    key = spec.get("key")
    if key is not None and not (isinstance(key, str) or callable(key)):
        raise ConfigurationError(
            f"{where}: {label('key')} must be a format string or a callable, got {key!r}"
        )
    if isinstance(key, str):
        format_fields(f"{where}: {label('key')}", key)
    return key


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def _name(spec: Mapping[str, Any], where: str, label: Label) -> str | None:
    name = spec.get("name")
    if name is not None and not (isinstance(name, str) and NAME.fullmatch(name)):
        raise ConfigurationError(
            f"{where}: {label('name')} must be an identifier (letters, digits, '_';"
            f" at most 64), got {name!r}"
        )
    return name


def unique_names(limits: Sequence[Limit], where: str, what: Callable[[int], str]) -> None:
    """Refuse a name given to two limits of one task (or of the worker-wide ones);
    ``what(i)`` names the setting of limit ``i`` in the message.

    Raises:
        ConfigurationError: naming ``where``, the setting and the name.
    """
    seen: set[str] = set()
    for i, limit in enumerate(limits):
        if limit.name is not None and limit.name in seen:
            raise ConfigurationError(
                f"{where}: {what(i)}={limit.name!r} is used twice; limit names are unique per task"
            )
        if limit.name is not None:
            seen.add(limit.name)


def parse_limit(
    spec: Any, *, pattern: str | None = None, where: str = "limit", label: Label = str
) -> Limit:
    """A ``Limit`` from a rate (``"30/m"``, ``"5"``, ``5``: see ``Rate.parse``) or
    ``{"rate": ..., "capacity": ..., "strategy": ..., "key": ..., "cost": ..., "scope": ...,
    "windows": ...}``; with a ``pattern`` (a
    worker-wide limit), ``key`` and ``cost`` are refused. ``label`` names each option in
    messages (``"capacity"`` -> ``"funnel_capacity"``, say).

    Raises:
        ConfigurationError: naming ``where``, the option and its value.
    """
    if isinstance(spec, Limit):
        return spec
    if isinstance(spec, (str, int, float, Rate)) and not isinstance(spec, bool):
        spec = {"rate": spec}  # "30/m", "5" or 5 (per second, as Celery reads rate_limit)
    if not isinstance(spec, Mapping) or "rate" not in spec:
        raise ConfigurationError(
            f"{where}: expected a rate like '30/m' or a dict with 'rate', got {spec!r}"
        )
    for name in spec:
        if name not in OPTIONS:
            raise ConfigurationError(
                f"{where}: unknown option {name!r}{did_you_mean(str(name), OPTIONS)};"
                f" a limit takes {list(OPTIONS)}"
            )
    if pattern is not None:
        _worker_wide(spec, where)
    fair_by, weights = check_fair(spec, where, label)
    try:
        rate = Rate.parse(spec["rate"])
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {label('rate')}: {exc}") from None
    capacity, cost = _capacity_and_cost(spec, where, label)
    windows = spec.get("windows", 10)
    if isinstance(windows, bool) or not isinstance(windows, int) or not 1 <= windows <= 100:
        raise ConfigurationError(
            f"{where}: {label('windows')} must be an integer from 1 to 100, got {windows!r}"
        )
    # every strategy registered so far: one registered after this module was imported too
    choices = strategies.names()
    strategy = _choice(where, label("strategy"), spec.get("strategy") or DEFAULT, choices)
    scope = _choice(where, label("scope"), spec.get("scope", "global"), SCOPES)
    key = _key(spec, where, label)
    name = _name(spec, where, label)
    adaptive = parse_adaptive(spec.get("adaptive"), rate, strategy, f"{where}: {label('adaptive')}")
    try:  # the strategy's own checks, named as the others are
        return Limit(
            rate, capacity, strategy, key, cost, pattern, scope, windows, fair_by, weights, name,
            adaptive,
        )  # fmt: skip
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
