"""Adaptive rates for GCRA funnels whose upstream publishes no limits
(``lua/adapt.lua``, with its Python twin for the memory backend): a refusal (HTTP 429)
multiplies the rate by ``decrease``, and while calls succeed it climbs back by
``increase`` per second, between ``min`` and the code's rate: one drop per ``every``
seconds at most (a burst of concurrent 429s counts once), and a climb only ``every``
after the last change. After a refusal at rate R, the climb stops one increase below R
for ``probe`` seconds (below ``R * (1 + decrease) / 2`` when R is under the last
refusal's rate: the limit fell, as TCP CUBIC's fast convergence reads it): the rate
settles under the upstream's limit instead of drawing a 429 on each climb, and looks
above it again after that.

Rates are kept as emission intervals (integer microseconds per unit), one hash field
per funnel key; a funnel back at its max rate has no field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError
from ..memstore import MemoryStore
from ..rate import Rate
from ..scripts import Arg, Call, Reply, Script, clock_arg, parse_now
from ..values import did_you_mean
from ._common import US, check_key, emission_us, now_us
from ._registry import capabilities

__all__ = [
    "REFUSED", "SUCCEEDED", "AdaptOp", "Adaptive", "adapt_call", "parse_adaptive",
    "rate_of",
]  # fmt: skip

REFUSED, SUCCEEDED = 1, 2
OPTIONS = ("min", "decrease", "increase", "every", "probe")
MAX_SECONDS = 86400.0


@dataclass(frozen=True)
class Adaptive:
    """How a limit's rate adapts: never below ``min``; a 429 multiplies it by
    ``decrease`` (0 < decrease < 1); a success adds ``increase`` (a rate); at most one
    change per ``every`` seconds; a 429's rate caps the climb for ``probe`` seconds."""

    min: Rate
    decrease: float = 0.5
    increase: Rate | None = None  # None: ``min``
    every: float = 1.0
    probe: float = 60.0

    def args(self, limit_rate: Rate) -> list[Arg]:
        """The script's ARGV[3..8] for a limit whose code rate is ``limit_rate``."""
        fast = emission_us(limit_rate.count, limit_rate.period)
        slow = max(emission_us(self.min.count, self.min.period), fast)
        climb = self.increase or self.min
        return [fast, slow, round(self.decrease * US), round(climb.count * US / climb.period),
                round(self.every * US), round(self.probe * US)]  # fmt: skip


def _seconds(where: str, name: str, value: Any, default: float) -> float:
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value <= MAX_SECONDS
    ):
        raise ConfigurationError(
            f"{where} {name} must be seconds above 0 and at most a day, got {value!r}"
        )
    return float(value)


def _rate(where: str, name: str, value: Any) -> Rate:
    try:
        return Rate.parse(value)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where} {name}: {exc}") from None


def parse_adaptive(spec: Any, rate: Rate, strategy: str, where: str) -> Adaptive | None:
    """A limit's ``"adaptive"`` entry: None, or ``{"min": "1/s", "decrease": 0.5,
    "increase": "1/s", "every": 1.0, "probe": 60.0}`` (only ``min`` is required);
    ``rate`` is the limit's (the max); ``where`` names the setting in messages.

    Raises:
        ConfigurationError: naming ``where``, the entry and the value.
    """
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or "min" not in spec:
        raise ConfigurationError(
            f"{where} must be a dict with at least 'min' (a rate), got {spec!r}"
        )
    for name in spec:
        if name not in OPTIONS:
            raise ConfigurationError(
                f"{where} has unknown option {name!r}"
                f"{did_you_mean(str(name), OPTIONS)}; it takes {list(OPTIONS)}"
            )
    if not capabilities(strategy).adapts:
        raise ConfigurationError(f"{where} needs the 'gcra' strategy, got {strategy!r}")
    low = _rate(where, "min", spec["min"])
    if low.count * rate.period > rate.count * low.period:
        raise ConfigurationError(
            f"{where} min {str(low)!r} is above the limit's rate {str(rate)!r}"
        )
    decrease = spec.get("decrease", 0.5)
    if isinstance(decrease, bool) or not isinstance(decrease, (int, float)):
        decrease = -1.0
    if not 0.01 <= decrease <= 0.99:
        raise ConfigurationError(
            f"{where} decrease must be a factor from 0.01 to 0.99, got {spec.get('decrease')!r}"
        )
    increase = spec.get("increase")
    return Adaptive(
        low, float(decrease), None if increase is None else _rate(where, "increase", increase),
        _seconds(where, "every", spec.get("every"), 1.0),
        _seconds(where, "probe", spec.get("probe"), 60.0),
    )  # fmt: skip


def _parse(stored: str | None, fast: int, every: int, now: int) -> tuple[int, int, int, int, bool]:
    if stored is None:
        return fast, now - every, 0, now - every, False
    t, at, ceil_t, ceil_at = (int(part) for part in stored.split(" "))
    return t, at, ceil_t, ceil_at, True


def _climb(t: int, fast: int, increase: int, ceil_t: int, capped: bool) -> int:
    new = max(fast, math.floor(1e12 / (1e12 / t + increase)))
    if capped:
        below = 1e12 / ceil_t - increase
        cap = math.floor(1e12 / below) if below > 0 else t
        new = min(t, max(new, cap))
    return new


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    field, event = str(argv[0]), int(argv[1])
    fast, slow, ppm, increase, every, probe = (int(a) for a in argv[2:8])
    now = parse_now(argv[8], store)
    found = store.hmget(keys[0], [field])[0]
    t, at, ceil_t, ceil_at, stored = _parse(found, fast, every, now)
    t = max(fast, min(slow, t))
    since = now - (ceil_at if event == REFUSED else at)  # a climb never delays a drop
    if since < every or (event == SUCCEEDED and not stored):
        return [t, 0]
    if event == REFUSED:
        fell = stored and now - ceil_at < probe and t > ceil_t  # the limit fell: see adapt.lua
        ceil_t, ceil_at = math.ceil(float(t) * 2e6 / (1e6 + ppm)) if fell else t, now
        new = min(slow, math.ceil(float(t) * 1e6 / ppm))
    else:
        new = _climb(t, fast, increase, ceil_t, now - ceil_at < probe)
        if new == t:
            return [t, 0]
    if new <= fast and now - ceil_at >= probe:
        store.hdel(keys[0], [field])
    else:
        store.hset(keys[0], {field: f"{new} {now} {ceil_t} {ceil_at}"})
    return [new, int(new != t)]


SCRIPT = Script.load("adapt", _twin)


def adapt_call(
    key: str, field: str, event: int, adaptive: Adaptive, rate: Rate, now: float | None
) -> Call:
    """The script call recording ``event`` (``REFUSED`` or ``SUCCEEDED``) on funnel
    ``field``'s adaptive rate, kept in hash ``key``."""
    check_key(key), check_key(field)
    if event not in (REFUSED, SUCCEEDED):
        raise ConfigurationError(f"adaptive event must be 1 or 2, got {event!r}")
    return SCRIPT, [key], [field, event, *adaptive.args(rate), clock_arg(now_us(now))]


@dataclass(frozen=True)
class AdaptOp:
    """``Funnel.adapt`` as an operation (``scripts.Op``): ``event`` (``REFUSED`` or
    ``SUCCEEDED``) recorded on funnel ``field``'s adaptive rate (``adaptive``, of code
    rate ``rate``), kept in hash ``key``; answers the emission interval in force
    (microseconds per unit) and whether the call changed it."""

    key: str
    field: str
    adaptive: Adaptive
    rate: Rate
    event: int = SUCCEEDED
    now: float | None = None

    def call(self) -> Call:
        return adapt_call(self.key, self.field, self.event, self.adaptive, self.rate, self.now)

    def answer(self, reply: Reply) -> tuple[int, bool]:
        return int(reply[0]), bool(reply[1])


def rate_of(t_us: int) -> Rate:
    """The rate of emission interval ``t_us`` (microseconds per unit)."""
    return Rate(1, t_us / US)
