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
from dataclasses import dataclass

from ..decision import Reservation
from ..errors import ConfigurationError
from ..keys import tickets_key
from ..memstore import MemoryStore
from ..scripts import Arg, Eval, Reply, Script, clock_arg, parse_now
from ._common import US, check_int, check_key, now_us, seconds
from .gcra import shape

ADMITTED, BOOKED, TOO_FAR, NEVER = 0, 1, 2, 3
# Stale tickets swept per booking, at most: bounded work per call (each booking adds one).
SWEEP = 100
# Early arrivals are honoured at most this soon before their slot by default:
# enough for timer jitter, small enough not to bunch fast funnels.
DEFAULT_EARLY_SECONDS = 0.05


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    now = parse_now(argv[0], store)
    ticket, redeem = str(argv[1]), str(argv[2]) == "1"
    early, late, max_wait = int(argv[3]), int(argv[4]), int(argv[5])
    tats, incs, taus = [], [], []
    for i, key in enumerate(keys[1:]):
        stored = store.get(key)
        tats.append(max(int(stored) if stored is not None else now, now))
        incs.append(int(argv[6 + 2 * i]))
        taus.append(int(argv[7 + 2 * i]))
    slot = max([now, *(tat + inc - tau for tat, inc, tau in zip(tats, incs, taus, strict=True))])
    latest, stale = max([now, *tats]), 0
    if redeem:
        booked = store.zscore(keys[0], ticket)
        if booked is not None:
            if now < booked - early:
                return [BOOKED, booked - now, latest - now, 0]
            store.zrem(keys[0], ticket)
            if now <= booked + late:
                return [ADMITTED, 0, latest - now, 0]
            stale = 1
            if len(tats) == 1 and tats[0] == booked + taus[0]:
                tats[0] = max(tats[0] - incs[0], now)
                slot = max(now, tats[0] + incs[0] - taus[0])
    if any(inc > tau for inc, tau in zip(incs, taus, strict=True)):
        return [NEVER, -1, latest - now, stale]
    delay = slot - now
    if delay > 0 and 0 <= max_wait < delay:
        return [TOO_FAR, delay, latest - now, stale]
    latest = now
    for key, tat, inc in zip(keys[1:], tats, incs, strict=True):
        new_tat = max(tat, slot) + inc
        store.set_px(key, str(new_tat), -(-(new_tat - now) // 1000))
        latest = max(latest, new_tat)
    if delay <= 0:
        return [ADMITTED, 0, latest - now, stale]
    if ticket:
        store.zremrangebyscore(keys[0], now - late, inclusive=False, count=int(argv[-1]))
        store.zadd(keys[0], {ticket: slot})
        store.pexpire(keys[0], -(-(delay + late) // 1000) + 1)
    return [BOOKED, delay, latest - now, stale]


SCRIPT = Script.load("reserve", _twin, admitted="r[1] == 0")


def _grace_us(name: str, value: float | None, default_us: int) -> int:
    if value is None:
        return default_us
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise ConfigurationError(f"{name} must be a non-negative number of seconds, got {value!r}")
    return round(value * US)


@dataclass(frozen=True, slots=True)
class Shape:
    """One funnel of a joint reservation: ``quantity`` units of a GCRA funnel ``key``."""

    key: str
    max_burst: int
    count: int
    period: float
    quantity: int = 1


def reserve_all(
    run: Eval,
    funnels: Sequence[Shape],
    *,
    ticket: str | None,
    redeem: bool,
    max_wait: float | None,
    early: float | None,
    late: float | None,
    now: float | None,
) -> Reservation:
    """One joint reservation through ``run``; see ``Funnel.reserve_all``."""
    if not funnels:
        raise ConfigurationError("reserve_all needs at least one funnel")
    if redeem and not ticket:
        raise ConfigurationError("redeem=True needs a ticket")
    pairs: list[Arg] = []
    limit, widest = 0, 0
    for shape_ in funnels:
        check_key(shape_.key)
        check_int("quantity", shape_.quantity, 1)
        funnel_limit, t, tau = shape(shape_.max_burst, shape_.count, shape_.period)
        pairs += [t * shape_.quantity, tau]
        limit, widest = limit or funnel_limit, max(widest, t * shape_.quantity)
    args: list[Arg] = [
        clock_arg(now_us(now)), ticket or "", "1" if redeem else "0",
        _grace_us("early", early, min(widest, round(DEFAULT_EARLY_SECONDS * US))),
        _grace_us("late", late, widest),
        -1 if max_wait is None else _grace_us("max_wait", max_wait, -1),
        *pairs, SWEEP,
    ]  # fmt: skip
    keys = [tickets_key(funnels[0].key), *(f.key for f in funnels)]
    status, delay_us, reset_us, stale = run(SCRIPT, keys, args)
    return Reservation(
        admitted=status == ADMITTED,
        delay=seconds(delay_us),
        booked=status == BOOKED,
        limit=limit,
        reset_after=seconds(reset_us),
        stale=bool(stale),
    )
