"""Sliding log: every admitted unit is logged with its time; at most ``limit`` in any
``period``. Exact at every instant, at the price of memory and work proportional to the
limit: fits small limits on long periods (logins per hour), not a million per minute.

The limit is bounded (``MAX_LOG_LIMIT``) so that one call's work is: a call adds at most
``limit`` entries and sweeps at most that many. A quantity above the limit is refused
before any entry is written.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..decision import Decision
from ..errors import ConfigurationError
from ..memstore import MemoryStore
from ..scripts import Arg, Eval, Reply, Script, clock_arg, parse_now
from . import _window
from ._common import check_int, check_key, now_us, period_us
from ._registry import Spec, Strategy, register


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    limit, period, quantity = int(argv[0]), int(argv[1]), int(argv[2])
    now = parse_now(argv[3], store)
    key = keys[0]
    store.zremrangebyscore(key, now - period)
    used = store.zcard(key)
    if quantity > 0 and used + quantity <= limit:
        seq = store.zcount(key, now, now)
        store.zadd(key, {f"{now}:{seq + i}": now for i in range(1, quantity + 1)})
        store.pexpire(key, -(-period // 1000))
        return [quantity, used + quantity, -1, period]
    scores = store.zscores(key)
    retry_after = -1
    if 0 < quantity <= limit:
        retry_after = scores[used + quantity - limit - 1] + period - now
    return [0, used, retry_after, scores[-1] + period - now if used else 0]


SCRIPT = Script.load("sliding_log", _twin, admitted=_window.ADMITTED)
# ~1.75 us of Redis time per entry written: a call blocks Redis for at most ~20 ms
MAX_LOG_LIMIT = 10_000


def check_limit(limit: int) -> None:
    """Refuse a sliding-log limit above ``MAX_LOG_LIMIT``, saying what to use instead."""
    if limit > MAX_LOG_LIMIT:
        raise ConfigurationError(
            f"sliding_log keeps one entry per unit: its limit must be at most"
            f" {MAX_LOG_LIMIT}, got {limit}; use sliding_window or gcra for larger limits"
        )


def sliding_log(
    run: Eval, key: str, limit: int, period: float, quantity: int, now: float | None
) -> Decision:
    """One sliding-log decision through ``run``; see ``Funnel.sliding_log``."""
    check_key(key)
    check_int("quantity", quantity, 0)
    limit, span = period_us(limit, period)
    check_limit(limit)
    return _window.decision(
        limit, quantity, run(SCRIPT, (key,), (limit, span, quantity, clock_arg(now_us(now))))
    )


def _check(spec: Spec) -> None:
    check_limit(spec.rate.count)


register(
    Strategy(
        "sliding_log",
        decide=lambda funnel, key, spec, quantity: funnel.sliding_log(
            key, spec.rate.count, spec.rate.period, quantity
        ),
        check=_check,
    )
)
