"""How one run's charges (``charges``) are decided against the store (``decide``): each funnel
charged exactly once per run of the task.

GCRA funnels whose keys may meet in one script (any standalone Redis; one hash tag on a
Cluster) are decided all or nothing in one atomic call: admitted when all admit, else one
slot is booked, the latest of them, in every funnel at once, and nothing else is taken.
Funnels that cannot share a call (other strategies, several Cluster slots) are decided
one at a time in a fixed order, in one round trip, stopping at the first refusal; the
ones already passed are remembered in the task's header and not charged again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from .._config.runtime import Runtime
from .._limiter.keys import hash_tag
from .._limiter.limit import Verdict, check_all
from .._limiter.strategies import capabilities
from .._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS, ReserveOp, Shape
from .charges import Charge
from .state import State

if TYPE_CHECKING:
    from .._limiter.backends.base import Funnel

__all__ = ["FairAdmit", "decide", "joint", "lead"]

LEAD_SECONDS = 0.005  # the most a held task comes back before its slot; see lead


def joint(runtime: Runtime, charges: Sequence[Charge]) -> bool:
    """Whether the charges can be decided in one script: every strategy ``joint``, and on a Redis
    Cluster one hash tag for every key."""
    if not all(capabilities(charge.limit.strategy).joint for charge in charges):
        return False
    client = getattr(runtime.funnel, "client", None)
    if client is None or "Cluster" not in type(client).__name__:
        return True
    return len({hash_tag(charge.key) for charge in charges}) == 1


def _width(charges: Sequence[Charge]) -> float:
    """One slot's width of the widest funnel (seconds)."""
    return max(c.limit.rate.period / c.limit.rate.count * max(c.cost, 1) for c in charges)


def _late(charges: Sequence[Charge], stale: int) -> float:
    """How late a booked slot is still honoured: one slot's width of the widest funnel,
    doubled each time the ticket went stale. (Wider would let late tickets start
    together: more than the rate in some second.)"""
    return _width(charges) * 2.0**stale


def lead(charges: Sequence[Charge]) -> float:
    """How early to come back for a booked slot (seconds): half a slot's width, at most
    ``LEAD_SECONDS``, inside the early grace the reservation allows (one slot's width,
    at most 50 ms), so that a timer firing a little late still lands inside the slot's
    window (at 100/s a 10 ms window behind the slot alone made late tasks book again:
    90/s measured). Slow funnels, whose window is wide, barely move (5 ms)."""
    return min(_width(charges), DEFAULT_EARLY_SECONDS, 2 * LEAD_SECONDS) / 2


Ticket = tuple[str, "int | None"]
"""A booking's ticket (the task id) and priority rank (None: none)."""


def _book(
    funnel: Funnel,
    charges: Sequence[Charge],
    ticket: Ticket,
    state: State,
    redeem: bool,
    max_wait: float | None,
) -> Verdict:
    """GCRA funnels in one reservation under ``ticket``: admitted now, or a slot booked
    in all of them (one funnel: ahead of less urgent bookings), but none further than
    ``max_wait`` seconds away (a task that expires before its slot books nothing)."""
    shapes = [
        Shape(c.key, c.limit.capacity - 1, c.limit.rate.count, c.limit.rate.period, c.cost)
        for c in charges
    ]
    late = _late(charges, state.stale)
    op = ReserveOp(shapes, ticket[0], redeem, max_wait, None, late, None, ticket[1])
    r = funnel.decide([op])[0]
    return Verdict(r.admitted, max(r.delay, 0.0), r.booked, r.never, r.stale)


FairAdmit = Callable[[Charge, int], Verdict]
"""How the worker gate admits a fair-share charge (``_shared.fair.admit``): the charge and
how often its ticket came too late."""


def _fair_first(
    charges: Sequence[Charge], state: State, fair: FairAdmit | None
) -> tuple[Verdict | None, State]:
    """A fair-share charge is decided first, alone (its slots are handed out by the
    dispatcher, not booked here): its verdict when it does not pass, else None and the
    state with it passed."""
    if fair is None:
        return None, state
    index = next(
        (i for i, c in enumerate(charges) if c.fair and c.cost > 0 and i not in state.passed),
        None,
    )
    if index is None:
        return None, state
    verdict = fair(charges[index], state.stale)
    if not verdict.run:
        return verdict, state
    return None, state._replace(booked=False, passed=(*state.passed, index))


def decide(
    runtime: Runtime,
    charges: Sequence[Charge],
    booking: tuple[str | None, int | None],
    state: State,
    max_wait: float | None = None,
    fair: FairAdmit | None = None,
    funnel: Funnel | None = None,
) -> tuple[Verdict, tuple[int, ...]]:
    """The verdict over every charge not yet passed, and the indexes passed after it;
    ``booking``: the ticket to book under (None: admit now or refuse) and its priority
    rank (None: none); ``max_wait``: book no slot further away (seconds; None: no
    bound); ``fair``: how a fair-share charge is admitted (None: decided as any other);
    ``funnel``: the store to decide on (None: the runtime's; ``_gate.inflight`` passes one
    that records or replays).

    Raises:
        BackendError: when the funnel's Redis fails.
    """
    verdict_, state = _fair_first(charges, state, fair)
    if verdict_ is not None:
        return verdict_, state.passed
    pending = [(i, c) for i, c in enumerate(charges) if c.cost > 0 and i not in state.passed]
    if not pending:
        return Verdict(run=True), state.passed
    funnel = funnel or runtime.funnel
    name, rank = booking
    ticket = None if name is None else (name, rank)
    redeem = ticket is not None and state.booked
    if len(pending) > 1 and joint(runtime, [c for _, c in pending]):
        if ticket is not None:
            together = [c for _, c in pending]
            return _book(funnel, together, ticket, state, redeem, max_wait), state.passed
        limits = [c.limit for _, c in pending]
        verdict = check_all(
            funnel, limits, [c.key for _, c in pending], [c.cost for _, c in pending],
            ticket=None, redeem=False, late=None,
        )  # fmt: skip
        return verdict, state.passed
    # one at a time, in order, stopping at the first refusal (one round trip on Redis)
    decisions = [
        _decision(charge, ticket, state, redeem and n == 0, max_wait)
        for n, (_, charge) in enumerate(pending)  # a booking is held on the first only
    ]
    # one decision (the common case) is one script already: no chain to build
    verdicts = (
        funnel._decide_in_order(decisions, _admits)
        if len(decisions) > 1
        else [decisions[0](funnel)]
    )
    passed = (*state.passed, *(i for (i, _), v in zip(pending, verdicts, strict=False) if v.run))
    return (verdicts[-1] if not verdicts[-1].run else Verdict(run=True)), passed


def _admits(verdict: Verdict) -> bool:
    return verdict.run


def _decision(
    charge: Charge, ticket: Ticket | None, state: State, redeem: bool, max_wait: float | None
) -> Callable[[Funnel], Verdict]:
    """One charge's decision, on any store: booked under ``ticket`` (GCRA), else plain."""
    if ticket is not None and capabilities(charge.limit.strategy).books:
        return partial(
            _book, charges=[charge], ticket=ticket, state=state, redeem=redeem, max_wait=max_wait
        )
    return partial(_check, charge=charge)


def _check(funnel: Funnel, charge: Charge) -> Verdict:
    return charge.limit.check(funnel, charge.key, charge.cost)
