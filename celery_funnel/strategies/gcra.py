"""GCRA, the funnel of the seeds: ``CL.THROTTLE`` semantics, one atomic step per call.

The funnel keeps one number per key, its TAT (theoretical arrival time). A request for
``q`` units moves the TAT ``q * T`` later, and is admitted when the moved TAT is at most
``tau = T * limit`` ahead of now. ``T`` is the emission interval (``period / count``,
rounded up to the microsecond) and ``limit = max_burst + 1``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._decision import Decision
from .._scripts import Arg, Eval, Reply, Script, clock_arg, parse_now
from ..backends.memstore import MemoryStore
from ._common import check_int, check_key, emission_us, now_us, seconds


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    t, tau, quantity = int(argv[0]), int(argv[1]), int(argv[2])
    now = parse_now(argv[3], store)
    stored = store.get(keys[0])
    tat = max(int(stored) if stored is not None else now, now)
    increment = t * quantity
    new_tat = tat + increment
    limited, retry_after, ttl = 0, -1, new_tat - now
    if new_tat - tau > now:
        limited, ttl = 1, tat - now
        if increment <= tau:
            retry_after = new_tat - tau - now
    elif quantity > 0:
        store.set_px(keys[0], str(new_tat), -(-ttl // 1000))
    remaining = (tau - ttl) // t if tau > ttl else 0
    return [limited, remaining, retry_after, ttl]


SCRIPT = Script.load("gcra", _twin)


def throttle(
    run: Eval, key: str, max_burst: int, count: int, period: float, quantity: int, now: float | None
) -> Decision:
    """One GCRA decision through ``run``; see ``Funnel.throttle``."""
    check_key(key)
    limit = check_int("max_burst", max_burst, 0) + 1
    check_int("quantity", quantity, 0)
    t = emission_us(count, period)
    limited, remaining, retry_us, reset_us = run(
        SCRIPT, (key,), (t, t * limit, quantity, clock_arg(now_us(now)))
    )
    return Decision(
        bool(limited), limit, remaining, seconds(retry_us), seconds(reset_us),
        0 if limited else quantity,
    )
