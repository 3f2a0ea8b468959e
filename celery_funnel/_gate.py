"""The one gate core: every funnel that applies to one run of a task, one decision.

Both entry points call it: the worker gate (``consumer.on_task_request``, the single gate
of every task a worker with celery-funnel installed receives) and ``FunnelTask.before_start``
(eager runs and workers without the gate). They differ only in how a task waits (held on
the consumer's timer, slept, or published again) and how it fails.

Charging: each funnel is charged exactly once per run of the task. GCRA funnels whose keys
may meet in one script (any standalone Redis; one hash tag on a Cluster) are decided all or
nothing in one atomic step: admitted when all admit, else one slot is booked, the latest
of them, in every funnel at once, and nothing else is taken. Funnels that cannot share a
step (other strategies, several Cluster slots) are decided one at a time in a fixed order;
the ones already passed are remembered in the task's header and not charged again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from ._errors import BackendError, CostTooHighError, TooManyDeferralsError
from ._fair import Fair
from ._gate_state import HEADER, State, admitted_by_gate, gate_mark, requeued
from ._keys import hash_tag
from ._limit import Limit, Verdict, check_all
from ._outage import backoff
from ._runtime import Runtime
from .strategies.reservation import DEFAULT_EARLY_SECONDS, Shape

if TYPE_CHECKING:
    from .backends.base import Funnel

__all__ = [
    "HEADER",
    "Charge",
    "State",
    "Step",
    "Subject",
    "admitted_by_gate",
    "gate_mark",
    "joint",
    "judge",
    "label_of",
    "lead",
    "report_wait",
    "requeued",
]


@dataclass(frozen=True)
class Charge:
    """One funnel a run of a task pays: ``cost`` units of ``limit`` on ``key``;
    ``label`` names it in signals and logs (the task name, or ``limit:<pattern>``)."""

    limit: Limit
    key: str
    cost: int
    label: str
    fair: Fair | None = None  # its tenant, on a fair-share funnel (_fair)


class Step(NamedTuple):
    """The gate's answer: ``run``; or wait ``delay`` seconds carrying ``state``; or fail
    with ``error``."""

    run: bool
    delay: float = 0.0
    state: State = State()
    error: BaseException | None = None
    booked: bool = False
    outage: bool = False
    queued: int = 0  # fair share: 1 park it in its tenant's queue, 2 in front (_fair)


RUN = Step(run=True)
LEAD_SECONDS = 0.005  # the most a held task comes back before its slot; see lead


def label_of(charges: Sequence[Charge]) -> str:
    """The funnels' names, joined: what a deferral by all of them reports."""
    return "+".join(dict.fromkeys(charge.label for charge in charges))


def joint(runtime: Runtime, charges: Sequence[Charge]) -> bool:
    """Whether the charges can be decided in one script: GCRA only, and on a Redis
    Cluster one hash tag for every key."""
    if any(charge.limit.strategy != "gcra" for charge in charges):
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


def _book(
    funnel: Funnel,
    charges: Sequence[Charge],
    ticket: str,
    state: State,
    redeem: bool,
    max_wait: float | None,
) -> Verdict:
    """GCRA funnels in one reservation under ``ticket``: admitted now, or a slot booked
    in all of them, but none further than ``max_wait`` seconds away (a task that
    expires before its slot books nothing)."""
    shapes = [
        Shape(c.key, c.limit.capacity - 1, c.limit.rate.count, c.limit.rate.period, c.cost)
        for c in charges
    ]
    r = funnel.reserve_all(
        shapes, ticket=ticket, redeem=redeem, late=_late(charges, state.stale), max_wait=max_wait
    )
    return Verdict(r.admitted, max(r.delay, 0.0), r.booked, r.never, r.stale)


FairStep = Callable[[Charge, int], Verdict]
"""The worker gate's step on a fair-share charge (``_fair_gate.admit``): the charge and
how often its ticket came too late."""


def _fair_first(
    charges: Sequence[Charge], state: State, fair: FairStep | None
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
    ticket: str | None,
    state: State,
    max_wait: float | None = None,
    fair: FairStep | None = None,
    funnel: Funnel | None = None,
) -> tuple[Verdict, tuple[int, ...]]:
    """The verdict over every charge not yet passed, and the indexes passed after it;
    ``max_wait``: book no slot further away (seconds; None: no bound); ``fair``: the
    step on a fair-share charge (None: decided as any other); ``funnel``: the store to
    decide on (None: the runtime's; ``_inflight`` passes one that records or replays).

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
    steps = [
        _step(charge, ticket, state, redeem and n == 0, max_wait)
        for n, (_, charge) in enumerate(pending)  # a booking is held on the first only
    ]
    # one step (the common case) is one script already: no chain to build
    verdicts = funnel._decide_in_order(steps, _admits) if len(steps) > 1 else [steps[0](funnel)]
    passed = (*state.passed, *(i for (i, _), v in zip(pending, verdicts, strict=False) if v.run))
    return (verdicts[-1] if not verdicts[-1].run else Verdict(run=True)), passed


def _admits(verdict: Verdict) -> bool:
    return verdict.run


def _step(
    charge: Charge, ticket: str | None, state: State, redeem: bool, max_wait: float | None
) -> Callable[[Funnel], Verdict]:
    """One charge's decision, on any store: booked under ``ticket`` (GCRA), else plain."""
    if ticket is not None and charge.limit.strategy == "gcra":
        return partial(
            _book, charges=[charge], ticket=ticket, state=state, redeem=redeem, max_wait=max_wait
        )
    return partial(_check, charge=charge)


def _check(funnel: Funnel, charge: Charge) -> Verdict:
    return charge.limit.check(funnel, charge.key, charge.cost)


@dataclass(frozen=True)
class Subject:
    """The run being judged: task ``name`` and ``task_id``; ``policy``: its
    ``funnel_on_backend_error``; ``dry_run``; ``eager``: an eager run (no broker to
    defer through, so "raise" is the only outage answer besides "allow"); ``expires_in``:
    seconds until it expires, past which no slot is booked for it; ``fair``: the step
    on a fair-share charge (the worker gate with parking on; None: an ordinary funnel)."""

    name: str
    task_id: str
    policy: str
    dry_run: bool = False
    eager: bool = False
    expires_in: float | None = None  # seconds until the task expires (None: never)
    fair: FairStep | None = None


def judge(
    runtime: Runtime,
    subject: Subject,
    charges: Sequence[Charge],
    state: State,
    funnel: Funnel | None = None,
) -> Step:
    """One decision over ``charges`` for ``subject``, with the outage policy, the caps
    and the reports (admitted, refused and dry-run deferrals; real deferrals are
    reported by the caller, who knows how the task waits); ``funnel`` as ``decide``.

    Raises:
        Exception: whatever computing a charge raised is the caller's to handle; Redis
            failures are not raised but handled by the policy.
    """
    label, observer = label_of(charges), runtime.observer
    settings = runtime.settings
    reserve = settings.reservation and not subject.dry_run
    ticket = subject.task_id if reserve else None
    try:
        verdict, passed = decide(
            runtime, charges, ticket, state, subject.expires_in, subject.fair, funnel
        )
    except BackendError as error:
        return _outage(runtime, subject, state, error, label)
    runtime.outage.answered()
    if verdict.run:
        observer.admitted(subject.name, subject.task_id, label, dry_run=subject.dry_run)
        return RUN
    if subject.dry_run:  # record what a real funnel would have done, and run
        observer.deferred(subject.name, subject.task_id, label, verdict.delay, dry_run=True)
        return RUN
    if verdict.never:
        costs = [charge.cost for charge in charges]
        capacities = [charge.limit.capacity for charge in charges]
        never = CostTooHighError(
            f"task {subject.name}[{subject.task_id}] costs {costs} units but its funnels"
            f" ({label}) hold {capacities}: it can never run"
        )
        return fail(runtime, subject, label, never)
    after = state._replace(
        deferrals=state.deferrals + 1,
        booked=verdict.booked,
        stale=state.stale + verdict.stale,
        outages=0,
        passed=passed,
    )
    cap = settings.max_deferrals
    if cap is not None and after.deferrals > cap:
        too_many = TooManyDeferralsError(
            f"task {subject.name}[{subject.task_id}] was deferred {state.deferrals} times"
            f" (funnel_max_deferrals={cap})"
        )
        return fail(runtime, subject, label, too_many)
    return Step(
        run=False, delay=verdict.delay, state=after, booked=verdict.booked, queued=verdict.queued
    )


def fail(runtime: Runtime, subject: Subject, label: str, error: BaseException) -> Step:
    """Report that the gate fails the run with ``error``."""
    runtime.observer.refused(subject.name, subject.task_id, label, error)
    return Step(run=False, error=error)


def _outage(
    runtime: Runtime, subject: Subject, state: State, error: BackendError, label: str
) -> Step:
    """The funnel's Redis failed: run anyway ("allow", or a dry run), fail ("raise",
    and eager runs), or wait a back-off ("defer"), keeping any booking."""
    runtime.outage.failed(error, subject.policy)
    if subject.policy == "allow" or subject.dry_run:
        return RUN
    if subject.policy == "raise" or subject.eager:
        return fail(runtime, subject, label, error)
    delay = backoff(state.outages, runtime.countdowns.cap)
    after = state._replace(deferrals=state.deferrals + 1, outages=state.outages + 1)
    return Step(run=False, delay=delay, state=after, booked=state.booked, outage=True)


def report_wait(
    runtime: Runtime,
    subject: Subject,
    label: str,
    step: Step,
    *,
    requeued: bool,
    send_event: Any = None,
) -> None:
    """Report a deferral: signals, the log line and (``send_event``) the Celery event."""
    runtime.observer.deferred(
        subject.name, subject.task_id, label, step.delay,
        deferrals=step.state.deferrals, booked=step.booked, outage=step.outage,
        requeued=requeued, send_event=send_event,
    )  # fmt: skip
