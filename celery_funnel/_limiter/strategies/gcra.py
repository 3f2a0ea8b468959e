"""GCRA, the funnel of the seeds: ``CL.THROTTLE`` semantics, one atomic script call per decision.

The funnel keeps one number per key, its TAT (theoretical arrival time). A request for
``q`` units moves the TAT ``q * T`` later, and is admitted when the moved TAT is at most
``tau = T * limit`` ahead of now. ``T`` is the emission interval (``period / count``,
rounded up to the microsecond, so the rate is never exceeded) and
``limit = max_burst + 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..decision import Decision
from ..errors import ConfigurationError
from ..memstore import MemoryStore
from ..scripts import Arg, Call, Eval, Reply, Script, clock_arg, parse_now
from ._common import check_int, check_key, emission_us, now_us, seconds
from ._registry import Spec, Strategy, register

# TATs are epoch microseconds (~2^51 today) plus tau: keep Lua's doubles exact.
MAX_TOLERANCE_US = 2**52


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    increment, tau = int(argv[0]), int(argv[1])
    now = parse_now(argv[2], store)
    stored = store.get(keys[0])
    tat = max(int(stored) if stored is not None else now, now)
    new_tat = tat + increment
    if new_tat - tau > now:
        return [now - tat - 1]
    if increment:
        store.set_px(keys[0], str(new_tat), -(-(new_tat - now) // 1000))
    return [new_tat - now]


def _admits(reply: Reply) -> bool:
    return reply[0] >= 0


SCRIPT = Script.load("gcra", _twin, admitted="r[1] >= 0", admits=_admits)


@lru_cache(maxsize=1024)
def funnel_shape(max_burst: int, count: int, period: float) -> tuple[int, int, int]:
    """Validated ``(limit, T, tau)`` of a funnel, T and tau in microseconds."""
    limit = check_int("max_burst", max_burst, 0) + 1
    t = emission_us(count, period)
    if t * limit > MAX_TOLERANCE_US:
        raise ConfigurationError(
            f"funnel too large: max_burst={max_burst!r} at {count!r}/{period!r}s spans"
            f" more than {MAX_TOLERANCE_US // 10**6 // 86400 // 365} years"
        )
    return limit, t, t * limit


def shape(max_burst: object, count: object, period: object) -> tuple[int, int, int]:
    """``funnel_shape`` for any input: unhashable values are refused clearly too."""
    try:
        return funnel_shape(max_burst, count, period)  # type: ignore[arg-type, unused-ignore]
    except TypeError:
        raise ConfigurationError(
            f"max_burst, count and period must be numbers, got {max_burst!r}, {count!r}, {period!r}"
        ) from None


def decode(reply: int, limit: int, t: int, tau: int, quantity: int) -> Decision:
    """The ``Decision`` that a ``gcra.lua`` reply stands for."""
    if reply >= 0:
        ttl, limited, retry_us = reply, False, -1
    else:
        ttl, limited = -reply - 1, True
        increment = t * quantity
        retry_us = ttl + increment - tau if increment <= tau else -1
    remaining = (tau - ttl) // t if tau > ttl else 0
    return Decision(
        limited, limit, remaining, seconds(retry_us), seconds(ttl), 0 if limited else quantity
    )


def _call(
    key: str, max_burst: int, count: int, period: float, quantity: int, now: float | None
) -> tuple[Call, tuple[int, int, int]]:
    """The script call of one decision (arguments checked), and ``(limit, T, tau)``."""
    check_key(key)
    check_int("quantity", quantity, 0)
    limit, t, tau = shape(max_burst, count, period)
    return (SCRIPT, (key,), (t * quantity, tau, clock_arg(now_us(now)))), (limit, t, tau)


def throttle(
    run: Eval, key: str, max_burst: int, count: int, period: float, quantity: int, now: float | None
) -> Decision:
    """One GCRA decision through ``run``; see ``Funnel.throttle``."""
    call, (limit, t, tau) = _call(key, max_burst, count, period, quantity, now)
    (reply,) = run(*call)
    return decode(reply, limit, t, tau, quantity)


@dataclass(frozen=True)
class ThrottleOp:
    """``Funnel.throttle`` as an operation (``scripts.Op``): one GCRA decision."""

    key: str
    max_burst: int
    count: int
    period: float
    quantity: int = 1
    now: float | None = None

    def call(self) -> Call:
        return _call(self.key, self.max_burst, self.count, self.period, self.quantity, self.now)[0]

    def answer(self, reply: Reply) -> Decision:
        return decode(reply[0], *shape(self.max_burst, self.count, self.period), self.quantity)


def _check(spec: Spec) -> None:
    try:
        shape(spec.capacity - 1, spec.rate.count, spec.rate.period)
    except ConfigurationError:
        raise ConfigurationError(
            f"capacity {spec.capacity} at {spec.rate} spans more than"
            f" {MAX_TOLERANCE_US // 10**6 // 86400 // 365} years: lower it"
        ) from None


register(Strategy(
    "gcra",
    decide=lambda funnel, key, spec, quantity: funnel.throttle(
        key, spec.capacity - 1, spec.rate.count, spec.rate.period, quantity
    ),
    reserve=lambda funnel, key, spec, quantity, ticket, redeem, late: funnel.reserve(
        key, spec.capacity - 1, spec.rate.count, spec.rate.period, quantity,
        ticket=ticket, redeem=redeem, late=late,
    ),
    check=_check,
))  # fmt: skip
