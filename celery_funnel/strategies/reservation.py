"""Reservation on a GCRA funnel: book the next free slot instead of competing again.

A refused caller books the slot at which the funnel would admit it (the TAT moves for
it at once, exactly as if it had been admitted) and learns the delay until that slot.
Under a ticket id it can come back and redeem the slot exactly once, and only near it:
from ``slot - early`` to ``slot + late``. Earlier, it is told to wait again; later, the
ticket is dropped and the caller books anew, so late tickets cannot burst together. A
stale ticket that was the funnel's last booking (the TAT is still ``slot + tau``) undoes
it first; a slot in the middle of later bookings is spent for good (giving it back would
bunch the next booking onto the one above it: a hypothesis simulation found exactly that).

A caller that is always later than ``late`` would book anew for ever behind a backlog;
callers widen ``late`` each time a ticket goes stale (the Celery layer doubles it).
"""

from __future__ import annotations

from collections.abc import Sequence

from .._decision import Reservation
from .._errors import ConfigurationError
from .._keys import companion_key
from .._scripts import Arg, Eval, Reply, Script, clock_arg, parse_now
from ..backends.memstore import MemoryStore
from ._common import US, check_int, check_key, now_us, seconds
from .gcra import shape

ADMITTED, BOOKED, TOO_FAR, NEVER = 0, 1, 2, 3
# Early arrivals are honoured at most this soon before their slot by default:
# enough for timer jitter, small enough not to bunch fast funnels.
DEFAULT_EARLY_SECONDS = 0.05


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    t, tau, quantity = int(argv[0]), int(argv[1]), int(argv[2])
    now = parse_now(argv[3], store)
    ticket, redeem = str(argv[4]), str(argv[5]) == "1"
    early, late, max_wait = int(argv[6]), int(argv[7]), int(argv[8])
    stored = store.get(keys[0])
    tat = max(int(stored) if stored is not None else now, now)
    stale = 0
    if redeem:
        slot = store.zscore(keys[1], ticket)
        if slot is not None:
            if now < slot - early:
                return [BOOKED, slot - now, tat - now, 0]
            store.zrem(keys[1], ticket)
            if now <= slot + late:
                return [ADMITTED, 0, tat - now, 0]
            stale = 1
            if tat == slot + tau:
                tat = max(tat - t * quantity, now)
    increment = t * quantity
    if increment > tau:
        return [NEVER, -1, tat - now, stale]
    new_tat = tat + increment
    delay = new_tat - tau - now
    if delay > 0 and 0 <= max_wait < delay:
        return [TOO_FAR, delay, tat - now, stale]
    store.set_px(keys[0], str(new_tat), -(-(new_tat - now) // 1000))
    if delay <= 0:
        return [ADMITTED, 0, new_tat - now, stale]
    if ticket:
        store.zremrangebyscore(keys[1], now - late, inclusive=False)
        store.zadd(keys[1], {ticket: new_tat - tau})
        store.pexpire(keys[1], -(-(delay + late) // 1000) + 1)
    return [BOOKED, delay, new_tat - now, stale]


SCRIPT = Script.load("reserve", _twin)


def _grace_us(name: str, value: float | None, default_us: int) -> int:
    if value is None:
        return default_us
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise ConfigurationError(f"{name} must be a non-negative number of seconds, got {value!r}")
    return round(value * US)


def reserve(
    run: Eval,
    key: str,
    max_burst: int,
    count: int,
    period: float,
    quantity: int,
    *,
    ticket: str | None,
    redeem: bool,
    max_wait: float | None,
    early: float | None,
    late: float | None,
    now: float | None,
) -> Reservation:
    """One reservation through ``run``; see ``Funnel.reserve``."""
    check_key(key)
    check_int("quantity", quantity, 1)
    if redeem and not ticket:
        raise ConfigurationError("redeem=True needs a ticket")
    limit, t, tau = shape(max_burst, count, period)
    slot_us = t * quantity
    args: list[Arg] = [
        t,
        tau,
        quantity,
        clock_arg(now_us(now)),
        ticket or "",
        "1" if redeem else "0",
        _grace_us("early", early, min(slot_us, round(DEFAULT_EARLY_SECONDS * US))),
        _grace_us("late", late, slot_us),
        -1 if max_wait is None else _grace_us("max_wait", max_wait, -1),
    ]
    status, delay_us, reset_us, stale = run(SCRIPT, (key, companion_key(key, "tickets")), args)
    return Reservation(
        admitted=status == ADMITTED,
        delay=seconds(delay_us),
        booked=status == BOOKED,
        limit=limit,
        reset_after=seconds(reset_us),
        stale=bool(stale),
    )
