"""The one gate core: every funnel that applies to one run of a task, one decision
(``judge``), with the outage policy, the caps and the reports.

Both entry points call it: the worker gate (``consumer.on_task_request``, the single gate
of every task a worker with celery-funnel installed receives) and ``FunnelTask.before_start``
(eager runs and workers without the gate). They differ only in how a task waits (held on
the consumer's timer, slept, or published again) and how it fails. How the charges
themselves are decided, each funnel once per run, is ``_shared.charges_decide``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .._config.outage import backoff
from .._config.runtime import Runtime
from .._limiter.errors import BackendError, CostTooHighError, TooManyDeferralsError
from .._limiter.words import plural
from .charges import Charge, label_of
from .charges_decide import FairAdmit, decide
from .state import State

if TYPE_CHECKING:
    from .._limiter.backends.base import Funnel

__all__ = ["RUN", "Ruling", "Subject", "judge", "on_outage", "report_wait", "waiting"]


class Ruling(NamedTuple):
    """The gate's answer: ``run``; or wait ``delay`` seconds carrying ``state``; or fail
    with ``error``."""

    run: bool
    delay: float = 0.0
    state: State = State()
    error: BaseException | None = None
    booked: bool = False
    outage: bool = False
    queued: int = 0  # fair share: 1 park it in its tenant's queue, 2 in front (_shared.fair)


RUN = Ruling(run=True)


class Subject(NamedTuple):
    """The run being judged: task ``name`` and ``task_id``; ``policy``: its
    ``funnel_on_backend_error``; ``dry_run``; ``eager``: an eager run (no broker to
    defer through, so "raise" is the only outage answer besides "allow"); ``expires_in``:
    seconds until it expires, past which no slot is booked for it; ``fair``: how a fair-share
    charge is admitted (``FairAdmit`` (the worker gate with parking on; None: an ordinary funnel);
    ``rank``: its place among the tasks waiting for a slot, the broker's priority order
    (0 first; ``_limiter.fair.rank``), None where no priority applies (eager runs).
    A named tuple: one is made per run on the gate's path, three times cheaper than a
    frozen dataclass."""

    name: str
    task_id: str
    policy: str
    dry_run: bool = False
    eager: bool = False
    expires_in: float | None = None  # seconds until the task expires (None: never)
    fair: FairAdmit | None = None
    rank: int | None = None


def judge(
    runtime: Runtime,
    subject: Subject,
    charges: Sequence[Charge],
    state: State,
    funnel: Funnel | None = None,
) -> Ruling:
    """One decision over ``charges`` for ``subject``, with the outage policy, the caps
    and the reports (admitted, refused and dry-run deferrals; real deferrals are
    reported by the caller, who knows how the task waits); ``funnel`` as ``decide``.

    Raises:
        Exception: whatever computing a charge raised is the caller's to handle; Redis
            failures are not raised but handled by the policy.
    """
    label, observer = label_of(charges), runtime.observer
    settings = runtime.settings
    try:  # while the funnels' Redis is known to fail, no call waits on it again
        runtime.outage.check()
    except BackendError as error:
        return on_outage(runtime, subject, state, error, label)
    # a named limit may be settled: a slot booked at the estimate would keep its
    # spacing however much is given back, so such runs wait for their charge to fit
    # and try again, and units given back reach the runs already waiting
    reserve = (
        settings.reservation
        and not subject.dry_run
        and all(charge.limit.name is None for charge in charges)
    )
    ticket = subject.task_id if reserve else None
    try:
        verdict, passed = decide(
            runtime,
            charges,
            (ticket, subject.rank),
            state,
            subject.expires_in,
            subject.fair,
            funnel,
        )
    except BackendError as error:
        return on_outage(runtime, subject, state, error, label)
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
            f"task {subject.name}[{subject.task_id}] was deferred {plural(state.deferrals, 'time')}"
            f" (funnel_max_deferrals={cap})"
        )
        return fail(runtime, subject, label, too_many)
    return Ruling(
        run=False, delay=verdict.delay, state=after, booked=verdict.booked, queued=verdict.queued
    )


def fail(runtime: Runtime, subject: Subject, label: str, error: BaseException) -> Ruling:
    """Report that the gate fails the run with ``error``."""
    runtime.observer.refused(subject.name, subject.task_id, label, error)
    return Ruling(run=False, error=error)


def on_outage(
    runtime: Runtime, subject: Subject, state: State, error: BackendError, label: str
) -> Ruling:
    """The funnel's Redis failed: run anyway ("allow", or a dry run), fail ("raise",
    and eager runs), or wait a back-off ("defer"), keeping any booking."""
    runtime.outage.failed(error, subject.policy)
    if subject.policy == "allow" or subject.dry_run:
        return RUN
    if subject.policy == "raise" or subject.eager:
        return fail(runtime, subject, label, error)
    delay = backoff(state.outages, runtime.countdowns.cap)
    after = state._replace(deferrals=state.deferrals + 1, outages=state.outages + 1)
    return Ruling(run=False, delay=delay, state=after, booked=state.booked, outage=True)


def waiting(runtime: Runtime, state: State) -> Ruling:
    """A copy the funnels' Redis cannot check now: it waits a back-off and is checked
    again, whatever ``funnel_on_backend_error`` says (it may be a stale copy)."""
    delay = backoff(state.outages, runtime.countdowns.cap)
    after = state._replace(outages=state.outages + 1)
    return Ruling(run=False, delay=delay, state=after, booked=state.booked, outage=True)


def report_wait(
    runtime: Runtime,
    subject: Subject,
    label: str,
    ruling: Ruling,
    *,
    requeued: bool,
    send_event: Any = None,
    how: str | None = None,
) -> None:
    """Report a deferral: signals, the log line and (``send_event``) the Celery event;
    ``how`` it waits (held, parked, republished; by default from ``requeued``)."""
    more = {} if how is None else {"how": how}
    runtime.observer.deferred(
        subject.name, subject.task_id, label, ruling.delay,
        deferrals=ruling.state.deferrals, booked=ruling.booked, outage=ruling.outage,
        requeued=requeued, send_event=send_event, **more,
    )  # fmt: skip
