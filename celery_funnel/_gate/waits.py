"""The worker gate's waits (``WaitSteps``, mixed into ``worker.WorkerGate``): a refused
task is held on the consumer's timer when its wait fits in what the broker allows an
un-acked message, parked in the funnels' Redis when parking is on, or published again
with the capped countdown; the original is acked only after it is parked or published."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from celery.worker.state import task_ready

from .._config.outage import BACKOFF_FIRST_SECONDS
from .._config.runtime import Runtime
from .fair import fair_charge
from .held import Held
from .judge import Charge, State, Step, Subject, label_of, lead, report_wait, requeued
from .parking import Parking
from .publish import republish
from .requests import until_expiry

__all__ = ["WaitSteps"]

logger = logging.getLogger("celery_funnel")


class WaitSteps:
    """What the worker gate does with a request a funnel refused."""

    runtime: Runtime
    parking: Parking
    held: Held

    if TYPE_CHECKING:  # the worker gate's own

        def _subject(self, request: Any) -> Subject:
            raise NotImplementedError

        def _send_event(self, request: Any) -> Callable[..., Any] | None:
            raise NotImplementedError

    def _wait(self, request: Any, charges: Sequence[Charge], step: Step) -> None:
        policy = self.runtime.countdowns
        # un-acked so far: the countdown it came with (an ETA message is held un-acked)
        # and what this worker held it for before
        budget = policy.cap - step.state.waited
        # a booked slot is honoured a little early: aim there, timers fire late
        aim = step.delay - lead(charges) if step.booked else step.delay
        hold = min(max(aim, 0.0), until_expiry(request))
        subject = self._subject(request)
        label = label_of(charges)
        until = until_expiry(request)
        if step.queued or self.parking.wants(step.delay, until, outage=step.outage):
            report_wait(
                self.runtime, subject, label, step, requeued=True,
                send_event=self._send_event(request),
            )  # fmt: skip
            self._park(request, charges, step, label)
            return
        if hold <= budget or policy.waits_in_place(step.delay):
            report_wait(
                self.runtime, subject, label, step, requeued=False,
                send_event=self._send_event(request),
            )  # fmt: skip
            waited = step.state.waited + hold
            self._hold(request, charges, step.state._replace(waited=waited), hold)
            return
        report_wait(
            self.runtime, subject, label, step, requeued=True,
            send_event=self._send_event(request),
        )  # fmt: skip
        self._republish(request, charges, step)

    def _republish(self, request: Any, charges: Sequence[Charge], step: Step) -> None:
        """Publish the task again for the capped countdown; ack the original after."""
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
            self._hold(request, charges, step.state, BACKOFF_FIRST_SECONDS)
            return
        request.acknowledge()
        task_ready(request)

    def _park(self, request: Any, charges: Sequence[Charge], step: Step, label: str) -> bool:
        """Park the task in the funnels' Redis until its slot; ack the original after.
        False when it could not be parked (it is held, to try again shortly)."""
        fair = fair_charge(charges, step.queued)
        try:
            fresh = self.parking.park(request, requeued(step.state, 0.0), step.delay, label, fair)
        except Exception as error:  # keep it, try again shortly
            logger.warning(
                "celery-funnel: could not park deferred task %s[%s] (%r); holding it %.0f s",
                request.name, request.id, error, BACKOFF_FIRST_SECONDS,
            )  # fmt: skip
            self._hold(request, charges, step.state, BACKOFF_FIRST_SECONDS)
            return False
        if not fresh:
            logger.info(
                "celery-funnel: task %s[%s] ran already (a stale copy): dropped",
                request.name, request.id,
            )  # fmt: skip
        request.acknowledge()
        task_ready(request)
        return fresh

    def _hold(self, request: Any, charges: Sequence[Charge], state: State, delay: float) -> None:
        self.held.hold(request, charges, state, delay)
