"""The worker gate: the single gate of every task a worker with celery-funnel installed
receives, FunnelTask or not, where every due task passes: ``consumer.on_task_request``.

It charges the task's own funnels (FunnelTask options) and every matching worker-wide
``funnel_limits`` entry in one decision (``judge``), and marks the runs it admits so
that ``FunnelTask.before_start`` does not charge them again. A task it defers never
reaches the pool: no ``STARTED`` state, no ``task_prerun``, no "ignored" log line.

One request's path reads top to bottom: read (``Arrival``: charges, slots, header,
subject, once) -> accept (a stale copy of a released task is dropped) -> slots
(``Slots``) -> decide (in flight, ``InFlightDecisions``, or waiting for the reply) ->
act (run it, or ``Waits``: hold, park, publish again; or fail it).

It runs on the consumer's event loop, so it never sleeps: a refused task is held on the
consumer's timer (as Celery holds ETA tasks) when that fits in what the broker allows an
un-acked message (``_config.countdown``), parked, or published again with the capped
countdown. Held requests are dropped when the broker connection closes, as Celery drops
its ETA timers: the broker delivers them again. Any error in the gate fails that one task.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from celery.worker.state import task_ready

from .._config.runtime import Runtime
from .._limiter.keys import safe_part
from .._limiter.limit import Limit
from .._stores.leases import Lease
from .arrival import Arrival, subject_of
from .charges import Charges
from .decisions import InFlightDecisions
from .held import Held, give_back_booking
from .inflight import InFlight
from .judge import HEADER, RUN, Charge, Ruling, State, gate_mark, judge, label_of
from .live import live_for
from .parking import Parking
from .requests import fail_request
from .slot_funnels import SlotFunnels
from .slots import Slots
from .waits import Waits

__all__ = ["WorkerGate"]

logger = logging.getLogger("celery_funnel")


class WorkerGate:
    """Wraps ``on_task_request`` (``handle``): passes a request on once every funnel that
    applies to it admits it; holds, parks, publishes again or fails it otherwise.
    ``own_options(task)``: whether the task's own ``funnel_*`` options apply (a
    FunnelTask)."""

    def __init__(
        self,
        runtime: Runtime,
        consumer: Any,
        handle: Callable[[Any], Any],
        own_options: Callable[[Any], bool],
    ) -> None:
        self.runtime, self.consumer, self.handle = runtime, consumer, handle
        self.own_options = own_options
        self.node = getattr(consumer, "hostname", "") or ""
        self.hostname = safe_part(self.node or "worker")
        self.charges = Charges(runtime, consumer.app, self.hostname)
        self.slot_funnels = SlotFunnels(runtime, consumer.app, self.node, self.hostname)
        self.parking = Parking(runtime)
        self.live = live_for(consumer.app)
        self.held = Held(runtime, consumer, self._pass)
        self.waits = Waits(runtime, self.parking, self.held, self.events)
        self.slots = Slots(
            runtime, self.slot_funnels, self.parking, self.waits, self._admit, self._fail
        )
        self.inflight = InFlight(lambda: runtime.funnel, getattr(consumer, "hub", None))
        self.decisions = InFlightDecisions(
            runtime, self.live, self.inflight, self._decide, self._decided, self._fail
        )

    @cached_property
    def transport(self) -> str:
        """The broker transport's driver ("redis", "amqp" ...): its priority order."""
        with self.consumer.app.connection_for_write() as connection:  # named, not connected
            return str(connection.transport.driver_type)

    def limits_for(self, name: str) -> tuple[Limit, ...]:
        """Every worker-wide limit whose pattern matches task ``name``."""
        return self.charges.worker_limits(name)

    def __call__(self, request: Any) -> Any:
        """Read and accept a request as it arrives; decide it when a funnel applies."""
        try:
            charges = self.charges.of(request.type, request.name, request.args, request.kwargs)
            slot_funnels = self.slot_funnels.of(
                request.type, request.name, request.args, request.kwargs
            )
        except Exception as error:  # a bad funnel_key fails its task only
            return self._fail(request, error, False)
        state = State.from_headers(request.request_dict)
        if not self.parking.accept(request, state):  # a copy of a release that ran
            request.acknowledge()
            task_ready(request)
            return None
        if not charges and not slot_funnels:
            return self.handle(request)
        return self._arrived(request, charges, slot_funnels, state)

    def _pass(self, request: Any, charges: Sequence[Charge], state: State) -> Any:
        """Decide a held request again (its timer fired, or it was woken): its charges
        stay the code's; its slots and subject are read anew."""
        try:
            slot_funnels = self.slot_funnels.of(
                request.type, request.name, request.args, request.kwargs
            )
        except Exception as error:  # a bad funnel_key fails its task only
            return self._fail(request, error, False)
        return self._arrived(request, charges, slot_funnels, state)

    def _arrived(
        self, request: Any, charges: Sequence[Charge], slot_funnels: Any, state: State
    ) -> Any:
        try:
            # only a fair-share charge has a fair step (asking for it asks if tasks may
            # be parked, which reads the funnels' Redis now and then)
            fair = self.parking.fair_step(request.id) if any(c.fair for c in charges) else None
            subject = subject_of(self.runtime, request, self.own_options, fair, self.transport)
        except Exception as error:  # a bad option value fails its task only
            return self._fail(request, error, False)
        return self._run(Arrival(request, charges, slot_funnels, state, subject))

    def _run(self, arrival: Arrival) -> Any:
        """Decide ``arrival`` now: slots, then the funnels; run, wait or fail it."""
        request = arrival.request
        self.held.backend_of(request)  # revoked() below may store REVOKED with it
        if request.revoked():  # revoked, or expired while it waited: Celery ends it
            give_back_booking(self.runtime, arrival.charges, arrival.state, request.id)
            self.slot_funnels.forget(request)
            return None
        lease: Lease | None = None
        try:
            if arrival.slot_funnels:  # the slots first: they can be given back, a rate's cannot
                lease, waits = self.slots.take(arrival)
                if lease is None:
                    return waits
            if lease is None and arrival.charges and self.decisions.send(arrival):
                return None  # carried on by ``decided`` when the reply comes
            step = self._decide(arrival) if arrival.charges else RUN
        except Exception as error:  # one task fails, the worker runs on
            if lease is not None:
                self.slot_funnels.give_back(lease)
            return self._fail(request, error, False)
        return self._decided(arrival, step, lease)

    def _decide(self, arrival: Arrival) -> Ruling:
        """``judge`` under the overrides in force (a paused funnel's task waits). The
        charges stay the code's (held requests keep them); overrides apply here, to
        every decision, from the table the live thread keeps fresh."""
        charges, state = arrival.charges, arrival.state
        paused = self.live.paused_step(charges, state, parked=lambda: self.parking.on)
        if paused is not None:
            return paused
        return judge(self.runtime, arrival.subject, self.live.apply(charges), state)

    def _decided(self, arrival: Arrival, step: Ruling, lease: Lease | None) -> Any:
        """Act on ``step``: run the request, make it wait, or fail it."""
        self.live.count(dict.fromkeys(c.label for c in arrival.charges), step.run)
        if step.run:
            return self._admit(arrival, lease)
        self.inflight.deferred()
        if lease is not None:  # a rate refused it: nothing stays charged
            self.slot_funnels.give_back(lease)
        if step.error is not None:
            return self._fail(arrival.request, step.error, True)
        return self.waits.wait(arrival, step)

    def _admit(self, arrival: Arrival, lease: Lease | None) -> Any:
        """Run the request: the run is decided and paid (``FunnelTask.before_start``
        sees the gate's mark and lets it through)."""
        request = arrival.request
        more = lease.header() if lease is not None else {}
        request.request_dict[HEADER] = arrival.state.header(gate=gate_mark(), **more)
        if lease is not None:
            self.slot_funnels.started(lease, request)
        return self.handle(request)

    def _fail(self, request: Any, error: BaseException, reported: bool) -> None:
        """Fail ``request`` with ``error`` as Celery fails a task (FAILURE stored,
        errbacks, ``task_failure``, ``task-failed``), ack it, and log one line unless
        the failure was ``reported`` already."""
        if not reported:
            logger.error(
                "celery-funnel: task %s[%s] failed in the gate: %s: %s",
                request.name, request.id, type(error).__name__, error,
            )  # fmt: skip
        self.held.forget(request.id)
        self.held.backend_of(request)
        fail_request(request, error)

    def events(self, request: Any) -> Callable[..., Any] | None:
        """The sender of ``request``'s Celery events (None: events are off)."""
        dispatcher = getattr(self.consumer, "event_dispatcher", None)
        if dispatcher is None or not dispatcher.enabled:
            return None

        def send(type_: str, **fields: Any) -> None:
            dispatcher.send(type_, uuid=request.id, **fields)

        return send

    def waiting(self) -> dict[str, int]:
        """How many requests this worker holds, per funnel label."""
        return dict(Counter(label_of(charges) for charges in self.held.charges()))

    def drop_held(self) -> int:
        """Forget every held request, and those whose decision is in flight (the broker
        connection closed: it delivers them again). Returns how many."""
        return self.held.drop() + self.inflight.drop()

    def close(self) -> None:
        """Stop sweeping; give back the slots still held; close the result-backend
        connections the gate opened."""
        self.held.close()
        self.slot_funnels.close()
        self.inflight.close()
