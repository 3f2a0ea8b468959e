"""Fixed window: at most ``limit`` units per window aligned on the epoch.

Fits an upstream that enforces its own fixed window (a quota that resets on the minute
or at midnight UTC), and the seed-004 case of granting part of a request.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..decision import Decision
from ..memstore import MemoryStore
from ..scripts import Arg, Eval, Reply, Script, clock_arg, parse_now
from . import _window
from ._common import check_int, check_key, now_us, period_us
from ._registry import Strategy, register


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    limit, window, quantity = int(argv[0]), int(argv[1]), int(argv[2])
    now = parse_now(argv[3], store)
    start = now - now % window
    finish = start + window
    w, n = store.hmget(keys[0], ("w", "n"))
    used = int(n) if w is not None and n is not None and int(w) == start else 0
    granted = _window.grant(quantity, limit - used, str(argv[4]) == "1")
    if granted > 0:
        used += granted
        store.hset(keys[0], {"w": str(start), "n": str(used)})
        store.pexpire(keys[0], -(-(finish - now) // 1000))
    rest = quantity - granted
    retry_after = finish - now if 0 < rest <= limit else -1
    return [granted, used, retry_after, finish - now if used > 0 else 0]


SCRIPT = Script.load("fixed_window", _twin, admitted=_window.ADMITTED)


def fixed_window(
    run: Eval, key: str, limit: int, period: float, quantity: int, partial: bool, now: float | None
) -> Decision:
    """One fixed-window decision through ``run``; see ``Funnel.fixed_window``."""
    check_key(key)
    check_int("quantity", quantity, 0)
    limit, window = period_us(limit, period)
    args: list[Arg] = [limit, window, quantity, clock_arg(now_us(now)), "1" if partial else "0"]
    return _window.decision(limit, quantity, run(SCRIPT, (key,), args))


register(
    Strategy(
        "fixed_window",
        decide=lambda funnel, key, spec, quantity: funnel.fixed_window(
            key, spec.rate.count, spec.rate.period, quantity
        ),
    )
)
