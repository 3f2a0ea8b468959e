"""What the worker gate does with a run a funnel refused (``Waits``): hold it on the
consumer's timer when its wait fits in what the broker allows an un-acked message, park
it in the funnels' Redis when parking is on, or publish it again with the capped
countdown; the original is acked only after it is parked or published."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.state import task_ready

from .._config.outage import BACKOFF_FIRST_SECONDS
from .._config.runtime import Runtime
from .arrival import Arrival
from .fair import fair_charge
from .held import Held
from .judge import Ruling, State, lead, report_wait, requeued
from .parking import Parking
from .publish import republish
from .requests import until_expiry

__all__ = ["Events", "Waits"]

logger = logging.getLogger("celery_funnel")

# the Celery event sender of a request (None: events are off)
Events = Callable[[Any], Callable[..., Any] | None]


class Waits:
    """The waits of one worker gate: ``events(request)`` sends a request's Celery events."""

    def __init__(self, runtime: Runtime, parking: Parking, held: Held, events: Events) -> None:
        self.runtime, self.parking, self.held, self.events = runtime, parking, held, events

    def report(self, arrival: Arrival, step: Ruling, label: str, *, how: str) -> None:
        """Report a deferral (signals, log line, Celery event): ``how`` it waits
        (``held``, ``parked``, ``republished``)."""
        report_wait(
            self.runtime, arrival.subject, label, step, requeued=how != "held",
            send_event=self.events(arrival.request), how=how,
        )  # fmt: skip

    def wait(self, arrival: Arrival, step: Ruling) -> None:
        """Hold, park or publish again ``arrival``, refused with ``step``."""
        request, policy = arrival.request, self.runtime.countdowns
        # un-acked so far: the countdown it came with (an ETA message is held un-acked)
        # and what this worker held it for before
        budget = policy.cap - step.state.waited
        until = until_expiry(request)
        # a booked slot is honoured a little early: aim there, timers fire late
        aim = step.delay - lead(arrival.charges) if step.booked else step.delay
        hold = min(max(aim, 0.0), until)
        if step.queued or self.parking.wants(step.delay, until, outage=step.outage):
            self.report(arrival, step, arrival.label, how="parked")
            self.park(arrival, step, arrival.label)
            return
        if hold <= budget or policy.waits_in_place(step.delay):
            self.report(arrival, step, arrival.label, how="held")
            self.hold(arrival, step.state._replace(waited=step.state.waited + hold), hold)
            return
        self.report(arrival, step, arrival.label, how="republished")
        self.republish(arrival, step)

    def republish(self, arrival: Arrival, step: Ruling) -> None:
        """Publish the task again for the capped countdown; ack the original after."""
        request = arrival.request
        # never past its expiry: it then arrives expired, and ends as Celery ends those
        countdown = min(self.runtime.countdowns.countdown(step.delay), until_expiry(request))
        try:
            republish(
                request.task, request._context, request.args, request.kwargs,
                countdown=countdown, state=requeued(step.state, countdown),
                content_type=request.content_type, content_encoding=request.content_encoding,
            )  # fmt: skip
        except Exception as error:  # keep it, try again shortly
            logger.warning(
                "celery-funnel: could not publish deferred task %s[%s] again (%r);"
                " holding it %.0f s",
                request.name, request.id, error, BACKOFF_FIRST_SECONDS,
            )  # fmt: skip
            self.hold(arrival, step.state, BACKOFF_FIRST_SECONDS)
            return
        request.acknowledge()
        task_ready(request)

    def park(self, arrival: Arrival, step: Ruling, label: str) -> bool:
        """Park the task in the funnels' Redis until its slot; ack the original after.
        False when it could not be parked (it is held, to try again shortly)."""
        request = arrival.request
        fair = fair_charge(arrival.charges, step.queued)
        try:
            state, rank = requeued(step.state, 0.0), arrival.subject.rank or 0
            fresh = self.parking.park(request, state, step.delay, label, fair, rank)
        except Exception as error:  # keep it, try again shortly
            logger.warning(
                "celery-funnel: could not park deferred task %s[%s] (%r); holding it %.0f s",
                request.name, request.id, error, BACKOFF_FIRST_SECONDS,
            )  # fmt: skip
            self.hold(arrival, step.state, BACKOFF_FIRST_SECONDS)
            return False
        if not fresh:
            logger.info(
                "celery-funnel: task %s[%s] ran already (a stale copy): dropped",
                request.name, request.id,
            )  # fmt: skip
        request.acknowledge()
        task_ready(request)
        return fresh

    def hold(self, arrival: Arrival, state: State, delay: float) -> None:
        """Hold the request on the consumer's timer for ``delay`` seconds."""
        self.held.hold(arrival.request, arrival.charges, state, delay)
