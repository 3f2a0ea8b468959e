"""What the worker gate does with a run a funnel refused (``Waits``), the way the wait
policy (``_config.waiting``) chooses: hold it on the consumer's timer, park it in the
funnels' Redis, or publish it again as a new copy with the capped countdown (recorded
first: ``copies``; on a Redis broker, backed up in the parked store instead:
``Parking.back_up``); the message held is acked only after it is parked or published.
When none of these can be done in time (the funnels' Redis fails), the message is
handed back to the broker (``delivery.hand_back``). Nor is a message moved past its
delivery's deadline: the broker may have given it to another worker by then, under the
same copy token, and the copies' record cannot tell that delivery from this one: a copy
published or parked now would run beside it. It is handed back instead, as a run is.

Each way is one row of ``ACTS``: its ``Way``, how reports name the wait, and its act
(docs/architecture.md, "Recipe: add a way to wait")."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .._config.outage import BACKOFF_FIRST_SECONDS
from .._config.runtime import Runtime
from .._config.waiting import Way
from .._shared.charges_decide import lead
from .._shared.copies import CopyGuard, new_token
from .._shared.delivery import ack, hand_back, until_expiry
from .._shared.fair import fair_charge
from .._shared.judge import Ruling, report_wait, waiting
from .._shared.publish import republish
from .._shared.state import State, requeued
from .._stores.copies import CopiesBusyError
from .arrival import Arrival
from .held import Held
from .parking import Parking

__all__ = ["ACTS", "Act", "Events", "Plan", "Publish", "Waits"]

logger = logging.getLogger("celery_funnel")

# the Celery event sender of a request (None: events are off)
Events = Callable[[Any], Callable[..., Any] | None]
# publishes a run again (``publish.republish``: the one publisher)
Publish = Callable[..., None]
# a hold shorter than this is not worth it: the message goes back to the broker
MIN_HOLD_SECONDS = 0.1


class Plan(NamedTuple):
    """What the wait policy chose a way from: ``hold``, the seconds a hold on the timer
    lasts (a booked slot aimed at a little early, never past the task's expiry), and
    ``left``, the seconds its delivery may still be held (``Delivery.hold_left``)."""

    hold: float
    left: float


class Act(NamedTuple):
    """What one way does: ``how`` reports name the wait (one of ``_config.observe.HOW``:
    ``held``, ``parked``, ``republished``), and ``run(waits, arrival, ruling, plan)``
    makes ``arrival``, refused with ``ruling``, wait."""

    how: str
    run: Callable[[Waits, Arrival, Ruling, Plan], object]


def _park(waits: Waits, arrival: Arrival, ruling: Ruling, plan: Plan) -> None:
    waits.park(arrival, ruling, arrival.label)


def _hold(waits: Waits, arrival: Arrival, ruling: Ruling, plan: Plan) -> None:
    waits.hold(arrival, ruling.state._replace(waited=ruling.state.waited + plan.hold), plan.hold)


def _back_off(waits: Waits, arrival: Arrival, ruling: Ruling, plan: Plan) -> None:
    """No copy can be recorded (the funnels' Redis fails): hold what is left, then the
    message is handed back."""
    waits.retry(arrival, ruling.state, plan.left)


def _publish(waits: Waits, arrival: Arrival, ruling: Ruling, plan: Plan) -> None:
    waits.republish(arrival, ruling)


# every way the wait policy chooses for a refused run, and its act (``Way.WAITER``, a
# run refused a seat, is ``concurrency.Seats``': parked, then queued)
ACTS: Mapping[Way, Act] = {
    Way.PARK: Act("parked", _park),
    Way.HOLD: Act("held", _hold),
    Way.BACK_OFF: Act("held", _back_off),
    Way.PUBLISH: Act("republished", _publish),
}


class Waits:
    """The waits of one worker gate: ``events(request)`` sends a request's Celery events;
    ``publish`` publishes a run again (``publish.republish``); ``acts``: each way's act
    (``ACTS``)."""

    acts: Mapping[Way, Act] = ACTS

    def __init__(
        self, runtime: Runtime, parking: Parking, copies: CopyGuard, held: Held, events: Events,
        publish: Publish = republish,
    ) -> None:  # fmt: skip
        self.runtime, self.parking, self.copies = runtime, parking, copies
        self.held, self.events, self.publish = held, events, publish

    def report(self, arrival: Arrival, ruling: Ruling, label: str, *, how: str) -> None:
        """Report a deferral (signals, log line, Celery event): ``how`` it waits
        (``held``, ``parked``, ``republished``)."""
        report_wait(
            self.runtime, arrival.subject, label, ruling, requeued=how != "held",
            send_event=self.events(arrival.request), how=how,
        )  # fmt: skip

    def wait(self, arrival: Arrival, ruling: Ruling) -> None:
        """Hold, park, publish again or hand back ``arrival``, refused with ``ruling``."""
        until = until_expiry(arrival.request)
        # a booked slot is honoured a little early: aim there, timers fire late
        aim = ruling.delay - lead(arrival.charges) if ruling.booked else ruling.delay
        hold = min(max(aim, 0.0), until)
        budget = arrival.delivery.hold_left()
        way = self.runtime.waiting.way(
            ruling.delay, hold, hold_left=budget, until_expiry=until, parking=self._parking,
            queued=bool(ruling.queued), outage=ruling.outage,
        )  # fmt: skip
        act = self.acts[way]
        self.report(arrival, ruling, arrival.label, how=act.how)
        act.run(self, arrival, ruling, Plan(hold, budget))

    def _parking(self) -> bool:
        return self.parking.on

    def republish(self, arrival: Arrival, ruling: Ruling) -> None:
        """Publish the task again as a new copy for the capped countdown, recorded
        first; ack the message held after."""
        request = arrival.request
        if _too_late(arrival):
            return
        # never past its expiry: it then arrives expired, and ends as Celery ends those
        countdown = min(self.runtime.countdowns.countdown(ruling.delay), until_expiry(request))
        token = new_token()
        arrival.delivery.accepted = False  # a copy may exist from now: checked again
        try:
            if not self._record(arrival, ruling, token, countdown):
                self._stale(request)
                return
            self.publish(
                request.task, request._context, request.args, request.kwargs,
                countdown=countdown, state={**requeued(ruling.state, countdown), "release": token},
                content_type=request.content_type, content_encoding=request.content_encoding,
            )  # fmt: skip
        except Exception as error:
            self._kept(arrival, ruling, "could not publish deferred task %s[%s] again (%r)", error)
            return
        ack(request)

    def _record(self, arrival: Arrival, ruling: Ruling, token: str, countdown: float) -> bool:
        """Record copy ``token`` of ``arrival`` before it is published with ``countdown``:
        with a backup of it (``Parking.back_up``) where one is kept, else in the copies'
        records. False when the copy held is stale.

        Raises:
            BackendError: when the funnels' Redis fails.
        """
        request = arrival.request
        if self.parking.backs_up:
            state = requeued(ruling.state, 0.0)
            return self.parking.back_up(request, state, arrival.label, token, countdown)
        return self.copies.move(request, arrival.state, token)

    def _kept(self, arrival: Arrival, ruling: Ruling, line: str, error: Exception) -> None:
        """Moving ``arrival`` failed with ``error`` (logged as ``line`` says, with the
        task's name, id and the error): keep its message, try again shortly. Another
        send of its id going first is no fault: logged at INFO."""
        request = arrival.request
        level = logging.INFO if isinstance(error, CopiesBusyError) else logging.WARNING
        logger.log(level, f"celery-funnel: {line}", request.name, request.id, error)
        self.retry(arrival, ruling.state, BACKOFF_FIRST_SECONDS)

    def retry(self, arrival: Arrival, state: State, delay: float) -> None:
        """Hold ``arrival`` ``delay`` seconds (at most what its delivery has left) to
        decide it again; hand it back to the broker when too little is left."""
        left = arrival.delivery.hold_left()
        if left < MIN_HOLD_SECONDS:
            hand_back(arrival.request, "no decision could be had in time")
        else:
            self.hold(arrival, state, min(delay, left))

    def recheck(self, arrival: Arrival, why: Exception) -> None:
        """``arrival``'s copy could not be checked (``why``): another send of its task
        id goes first (``CopiesBusyError``: held a little, then checked again), or the
        funnels' Redis failed (it waits an outage back-off). Handed back to the broker
        when its delivery has too little left."""
        if isinstance(why, CopiesBusyError):
            self.retry(arrival, arrival.state, BACKOFF_FIRST_SECONDS)
        else:
            self.wait(arrival, waiting(self.runtime, arrival.state))

    def _stale(self, request: Any) -> None:
        """Drop ``request``: another copy of its task was accepted."""
        logger.info(
            "celery-funnel: task %s[%s] is a stale copy (another copy goes on): dropped",
            request.name, request.id,
        )  # fmt: skip
        ack(request)

    def park(
        self, arrival: Arrival, ruling: Ruling, label: str, queue: Callable[[], None] | None = None
    ) -> bool:
        """Park the task in the funnels' Redis until its slot (``queue``: the call that
        queues it for one, ``Parking.park``); ack the original after. False when it
        could not be parked (it is held, to try again shortly, or handed back past its
        delivery's deadline)."""
        request = arrival.request
        if _too_late(arrival):
            return False
        fair = fair_charge(arrival.charges, ruling.queued)
        arrival.delivery.accepted = False  # parked from now, should the reply be lost
        try:
            state, rank = requeued(ruling.state, 0.0), arrival.subject.rank or 0
            fresh = self.parking.park(request, state, ruling.delay, label, fair, rank, queue)
        except Exception as error:
            self._kept(arrival, ruling, "could not park deferred task %s[%s] (%r)", error)
            return False
        if not fresh:
            self._stale(request)
            return False
        ack(request)
        return True

    def hold(self, arrival: Arrival, state: State, delay: float) -> None:
        """Hold the request on the consumer's timer for ``delay`` seconds."""
        self.held.hold(arrival.request, arrival.charges, state, delay)


def _too_late(arrival: Arrival) -> bool:
    """Whether ``arrival``'s delivery is past its deadline: then it is handed back to the
    broker, not moved (see the module)."""
    if not arrival.delivery.past_deadline():
        return False
    hand_back(arrival.request, "its delivery's deadline passed before it could be moved")
    return True
