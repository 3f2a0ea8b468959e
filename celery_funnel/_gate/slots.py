"""The worker gate's waits for concurrency slots (``SlotWaits``, mixed into
``worker.WorkerGate``): take the slots a run needs, or park it as a waiter (queued in
arrival order, published again by the run that frees a slot), or apply the outage
policy when the funnels' Redis fails."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._config.runtime import Runtime
from .._limiter.errors import BackendError
from .._stores.leases import Lease, Seat
from .judge import HEADER, Charge, State, Step, Subject, gate_mark, report_wait
from .judge import _outage as outage_step
from .parking import Parking
from .seats import WAIT_SECONDS, Seats

__all__ = ["SlotWaits"]

logger = logging.getLogger("celery_funnel")

# how often a task waiting for a slot in the worker (nothing parked) tries again
POLL_SECONDS = 0.5


class SlotWaits:
    """What the worker gate does with the concurrency slots of a request."""

    runtime: Runtime
    seats: Seats
    parking: Parking
    handle: Callable[[Any], Any]

    if TYPE_CHECKING:  # the worker gate's own

        def _park(self, request: Any, charges: Sequence[Charge], step: Step, label: str) -> bool:
            raise NotImplementedError

        def _fail(self, request: Any, error: BaseException, *, reported: bool) -> None:
            raise NotImplementedError

        def _wait(self, request: Any, charges: Sequence[Charge], step: Step) -> None:
            raise NotImplementedError

        def _subject(self, request: Any) -> Subject:
            raise NotImplementedError

        def _send_event(self, request: Any) -> Callable[..., Any] | None:
            raise NotImplementedError

    def _take_slots(
        self, request: Any, charges: Sequence[Charge], state: State, seats: Sequence[Seat]
    ) -> tuple[Lease | None, Any]:
        """The lease of every slot in ``seats``, or (None, what the gate returns) when
        the request waits: parked, held for an outage back-off, run or failed by the
        outage policy.

        Raises:
            Exception: what computing a key raised (the gate fails the task).
        """
        try:
            lease = self.seats.take(request, seats)
        except BackendError as error:
            return None, self._slot_outage(request, charges, state, seats, error)
        if lease is None:
            self._wait_for_slot(request, charges, state, seats)
        return lease, None

    def _slot_outage(
        self,
        request: Any,
        charges: Sequence[Charge],
        state: State,
        seats: Sequence[Seat],
        error: BackendError,
    ) -> Any:
        """The funnels' Redis failed taking a slot: the outage policy decides (run
        now, unlimited; fail; or hold for a back-off and try again)."""
        label = "+".join(seat.label for seat in seats)
        step = outage_step(self.runtime, self._subject(request), state, error, label)
        if step.run:
            request.request_dict[HEADER] = state.header(gate=gate_mark())
            return self.handle(request)
        if step.error is not None:
            return self._fail(request, step.error, reported=True)
        return self._wait(request, charges, step)

    def _wait_for_slot(
        self, request: Any, charges: Sequence[Charge], state: State, seats: Sequence[Seat]
    ) -> None:
        """No slot: park the task with no release time and queue it; the run that frees
        a slot hands it over and publishes it (``_leases``). Where nothing may be parked
        (``_persistence``), the task waits in the worker (or the broker, past what it
        may hold) and tries again every ``POLL_SECONDS``."""
        label = "+".join(seat.label for seat in seats)
        if not self.parking.on:
            after = state._replace(deferrals=state.deferrals + 1)
            self._wait(request, charges, Step(run=False, delay=POLL_SECONDS, state=after))
            return
        step = Step(
            run=False, delay=WAIT_SECONDS, state=state._replace(deferrals=state.deferrals + 1)
        )
        report_wait(
            self.runtime, self._subject(request), label, step._replace(delay=0.0),
            requeued=True, send_event=self._send_event(request),
        )  # fmt: skip
        if not self._park(request, charges, step, label):
            return  # held, to try again shortly
        try:
            self.seats.queue(request, seats)
        except BackendError as error:  # parked but not queued: released within the hour
            logger.warning(
                "celery-funnel: task %s[%s] parked for a slot, but not queued (%r): it is"
                " checked again in %.0f s", request.name, request.id, error, WAIT_SECONDS,
            )  # fmt: skip
