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

A booking may carry a priority ``rank`` (0 most urgent, as the broker orders messages).
On one funnel, a ticket of rank r takes the earliest future slot of a ticket of a rank
above r instead of the tail; the displaced ticket finds itself gone when it comes back
and books anew at the tail. No TAT moves, so the rate stays exact: each slot was paid
once, when it was first booked. Tickets of rank 0, and tickets booked without a rank or
jointly on several funnels, are never displaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..decision import Reservation
from ..errors import ConfigurationError
from ..keys import ranks_key, tickets_key
from ..memstore import MemoryStore
from ..scripts import Arg, Call, Reply, Script, clock_arg, parse_now
from ._common import US, check_int, check_key, now_us, seconds
from .gcra import shape

ADMITTED, BOOKED, TOO_FAR, NEVER = 0, 1, 2, 3
# Stale tickets swept, and booked tickets looked through for a less urgent one, per
# booking at most: bounded work per call (each booking adds one ticket).
SWEEP = 100
LEAST_URGENT = 255  # the highest rank: it displaces nobody
# Early arrivals are honoured at most this soon before their slot by default:
# enough for timer jitter, small enough not to bunch fast funnels.
DEFAULT_EARLY_SECONDS = 0.05


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    now = parse_now(argv[0], store)
    ticket, redeem = str(argv[1]), str(argv[2]) == "1"
    early, late, max_wait = int(argv[3]), int(argv[4]), int(argv[5])
    rank = None if argv[6] == "" else int(argv[6])
    tickets, ranks, funnels = keys[0], keys[1], keys[2:]
    tats = [max(int(store.get(key) or now), now) for key in funnels]
    incs = [int(argv[7 + 2 * i]) for i in range(len(funnels))]
    taus = [int(argv[8 + 2 * i]) for i in range(len(funnels))]
    bound = int(argv[7 + 2 * len(funnels)])
    slot = max([now, *(tat + inc - tau for tat, inc, tau in zip(tats, incs, taus, strict=True))])
    latest, stale = max([now, *tats]), 0
    if redeem:
        booked = store.zscore(tickets, ticket)
        if booked is not None:
            if now < booked - early:
                return [BOOKED, booked - now, latest - now, 0]
            store.zrem(tickets, ticket)
            store.hdel(ranks, [ticket])
            if now <= booked + late:
                return [ADMITTED, 0, latest - now, 0]
            stale = 1
            if len(tats) == 1 and tats[0] == booked + taus[0]:
                tats[0] = max(tats[0] - incs[0], now)
                slot = max(now, tats[0] + incs[0] - taus[0])
    if any(inc > tau for inc, tau in zip(incs, taus, strict=True)):
        return [NEVER, -1, latest - now, stale]
    delay = slot - now
    urgent = rank is not None and rank < LEAST_URGENT and len(tats) == 1
    taken = None
    if delay > 0 and ticket and urgent:
        taken = _displace(store, (tickets, ranks), ticket, rank or 0, (now, max_wait, bound))
    if taken is not None:
        return [BOOKED, taken - now, latest - now, stale]
    if delay > 0 and 0 <= max_wait < delay:
        return [TOO_FAR, delay, latest - now, stale]
    latest = now
    for key, tat, inc in zip(funnels, tats, incs, strict=True):
        new_tat = max(tat, slot) + inc
        store.set_px(key, str(new_tat), -(-(new_tat - now) // 1000))
        latest = max(latest, new_tat)
    if delay <= 0:
        return [ADMITTED, 0, latest - now, stale]
    if ticket:
        rank_ = rank if len(tats) == 1 else None
        _ticket(store, (tickets, ranks), (ticket, rank_, slot), (now, late, bound))
    return [BOOKED, delay, latest - now, stale]


def _ticket(
    store: MemoryStore, keys: tuple[str, str], booking: tuple[str, int | None, int],
    times: tuple[int, int, int],
) -> None:  # fmt: skip
    """Book ``booking`` (ticket, rank, slot µs) after sweeping stale tickets; ``times``:
    now, late grace (µs) and the sweep's bound."""
    tickets, ranks = keys
    ticket, rank, slot = booking
    now, late, bound = times
    store.hdel(ranks, store.zremrangebyscore(tickets, now - late, inclusive=False, count=bound))
    if store.zcard(tickets) == 0:
        store.delete(ranks)
    store.zadd(tickets, {ticket: slot})
    ttl = -(-(slot - now + late) // 1000) + 1
    store.pexpire(tickets, ttl)
    if rank:
        store.hset(ranks, {ticket: str(rank)})
        store.pexpire(ranks, ttl)


def _displace(
    store: MemoryStore, keys: tuple[str, str], ticket: str, rank: int,
    limits: tuple[int, int, int],
) -> int | None:  # fmt: skip
    """Give ``ticket`` the earliest future slot of a less urgent ticket (its slot), or
    None; ``limits``: now, max wait (µs, -1 none) and how many tickets to look at."""
    tickets, ranks = keys
    now, max_wait, bound = limits
    if max_wait == 0 or not store.hgetall(ranks):
        return None
    ahead = store.zrange_above(tickets, now, bound)
    others = store.hmget(ranks, [member for member, _ in ahead])
    for (other, at), other_rank in zip(ahead, others, strict=True):
        if int(other_rank or 0) > rank and (max_wait < 0 or at - now <= max_wait):
            store.zrem(tickets, other)
            store.hdel(ranks, [other])
            store.zadd(tickets, {ticket: at})
            if rank:
                store.hset(ranks, {ticket: str(rank)})
            return at
    return None


def _admits(reply: Reply) -> bool:
    return reply[0] == ADMITTED


SCRIPT = Script.load("reserve", _twin, admitted="r[1] == 0", admits=_admits)


def _grace_us(name: str, value: float | None, default_us: int) -> int:
    if value is None:
        return default_us
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise ConfigurationError(f"{name} must be a non-negative number of seconds, got {value!r}")
    return round(value * US)


def _rank(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LEAST_URGENT:
        raise ConfigurationError(f"rank must be an integer from 0 to {LEAST_URGENT}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Shape:
    """One funnel of a joint reservation: ``quantity`` units of a GCRA funnel ``key``."""

    key: str
    max_burst: int
    count: int
    period: float
    quantity: int = 1


class ReserveOp(NamedTuple):
    """``Funnel.reserve_all`` as an operation (``scripts.Op``): one joint reservation
    on ``funnels``, all or nothing. A named tuple: one is built per booking, on the
    worker's path of every task (a frozen dataclass costs four times as much)."""

    funnels: Sequence[Shape]
    ticket: str | None = None
    redeem: bool = False
    max_wait: float | None = None
    early: float | None = None
    late: float | None = None
    now: float | None = None
    rank: int | None = None

    def call(self) -> Call:
        funnels, ticket, redeem = self.funnels, self.ticket, self.redeem
        if not funnels:
            raise ConfigurationError("reserve_all needs at least one funnel")
        if redeem and not ticket:
            raise ConfigurationError("redeem=True needs a ticket")
        pairs: list[Arg] = []
        widest = 0
        for shape_ in funnels:
            check_key(shape_.key)
            check_int("quantity", shape_.quantity, 1)
            _, t, tau = shape(shape_.max_burst, shape_.count, shape_.period)
            pairs += [t * shape_.quantity, tau]
            widest = max(widest, t * shape_.quantity)
        args: list[Arg] = [
            clock_arg(now_us(self.now)), ticket or "", "1" if redeem else "0",
            _grace_us("early", self.early, min(widest, round(DEFAULT_EARLY_SECONDS * US))),
            _grace_us("late", self.late, widest),
            -1 if self.max_wait is None else _grace_us("max_wait", self.max_wait, -1),
            "" if self.rank is None else _rank(self.rank),
            *pairs, SWEEP,
        ]  # fmt: skip
        first = funnels[0].key
        return SCRIPT, [tickets_key(first), ranks_key(first), *(f.key for f in funnels)], args

    def answer(self, reply: Reply) -> Reservation:
        status, delay_us, reset_us, stale = reply
        return Reservation(
            admitted=status == ADMITTED,
            delay=seconds(delay_us),
            booked=status == BOOKED,
            limit=self.funnels[0].max_burst + 1,  # the first funnel's (checked by call)
            reset_after=seconds(reset_us),
            stale=bool(stale),
        )
