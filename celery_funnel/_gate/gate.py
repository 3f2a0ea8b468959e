"""The worker gate: the single gate of every task a worker with celery-funnel installed
receives, FunnelTask or not, where every due task passes: ``consumer.on_task_request``.

It charges the task's own funnels (FunnelTask options) and every matching worker-wide
``funnel_limits`` entry in one decision (``judge``), and marks the runs it admits so
that ``FunnelTask.before_start`` does not charge them again. A task it defers never
reaches the pool: no ``STARTED`` state, no ``task_prerun``, no "ignored" log line.

One request's path reads top to bottom: read (``Arrival``: charges, slots, header,
subject, its ``Delivery``, once) -> accept (a copy that is not its task's accepted one
is dropped: ``CopyGuard``) -> seats (``Seats``) -> decide (in flight,
``InFlightDecisions``, or waiting for the reply) -> act (run it, or ``Waits``: hold,
park, publish again, hand back; or fail it). No run starts from a delivery past its
deadline (``delivery``): the message goes back to the broker instead.

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

from .._config.runtime import Runtime
from .._limiter.errors import BackendError
from .._limiter.keys import safe_part
from .._limiter.limit import Limit
from .._stores.leases import Lease
from .allowance import Allowances
from .arrival import Arrival, TaskOptions, subject_of
from .charges import Charge, Charges, OwnOf, label_of, labels_of
from .concurrency import RenewalOf, Seats, SlotFunnels
from .copies import CopyGuard
from .delivery import Delivery, ack, delivery_of, hand_back
from .failing import Failing
from .follow import Follow, Next, follows_of
from .held import Held, cancel_run_booking
from .inflight import InFlightDecisions
from .inflight_connection import InFlight
from .judge import RUN, Ruling, judge, waiting
from .live import live_for
from .parking import Parking
from .publish import republish
from .state import HEADER, State, gate_mark
from .waits import Publish, Waits
from .window import Window

__all__ = ["WorkerGate"]

OWN: Any = object()  # a follower that runs its own body: decided as any run

logger = logging.getLogger("celery_funnel")


class WorkerGate:
    """Wraps ``on_task_request`` (``handle``): passes a request on once every funnel that
    applies to it admits it; holds, parks, publishes again or fails it otherwise.
    ``own_options(task)``: whether the task's own ``funnel_*`` options apply (a
    FunnelTask); ``own_charges(task)``: what its runs pay on them; ``renewal``: the
    service renewing the leases of seats taken (``_celery.services`` hands them);
    ``publish``: how a refused run is published again (``publish.republish``)."""

    def __init__(
        self,
        runtime: Runtime,
        consumer: Any,
        handle: Callable[[Any], Any],
        own_options: Callable[[Any], bool],
        *,
        own_charges: OwnOf,
        renewal: RenewalOf,
        publish: Publish = republish,
    ) -> None:
        self.runtime, self.consumer, self.handle = runtime, consumer, handle
        self.own_options = own_options
        self.options = TaskOptions(runtime, own_options)
        self.node = getattr(consumer, "hostname", "") or ""
        self.hostname = safe_part(self.node or "worker")
        self.charges = Charges(runtime, consumer.app, self.hostname, own_charges)
        self.slot_funnels = SlotFunnels(runtime, consumer.app, self.node, self.hostname, renewal)
        # kombu's Redis transport loses a message taken off the queue as the broker dies
        # or the worker is killed: copies published again are backed up there (not on
        # celery_funnel.transport, whose fetch records a message in the call that takes it)
        self.parking = Parking(runtime, backups=self._broker == ("redis", False))
        self.copies = CopyGuard(runtime, unconfirmed_acks=self.transport == "amqp")
        self.follow = Follow(runtime)
        self.live = live_for(consumer.app)
        self.held = Held(runtime, consumer, self._pass)
        self.failing = Failing(self.held)
        self.waits = Waits(runtime, self.parking, self.copies, self.held, self.events, publish)
        self.seats = Seats(
            runtime, self.slot_funnels, self.parking, self.waits, self._admit, self.failing.fail
        )
        self.inflight = InFlight(
            lambda: runtime.funnel, getattr(consumer, "hub", None),
            runtime.settings.socket_timeout, self._no_reply,
        )  # fmt: skip
        self.window = Window(consumer)
        self.decisions = InFlightDecisions(
            runtime, self.live, self.inflight, self._decide, self._decided, self.failing.fail,
            self.window, Allowances(runtime, self.live) if runtime.settings.allowance else None,
        )  # fmt: skip

    @cached_property
    def _broker(self) -> tuple[str, bool]:
        """The broker transport's driver ("redis", "amqp" ...), and whether it records a
        message in the call that takes it (``celery_funnel.transport``)."""
        with self.consumer.app.connection_for_write() as connection:  # named, not connected
            transport = connection.transport
            return str(transport.driver_type), bool(getattr(transport, "fetch_records", False))

    @property
    def transport(self) -> str:
        """The broker transport's driver ("redis", "amqp" ...): its priority order."""
        return self._broker[0]

    def limits_for(self, name: str) -> tuple[Limit, ...]:
        """Every worker-wide limit whose pattern matches task ``name``."""
        return self.charges.worker_limits(name)

    def __call__(self, request: Any) -> Any:
        """Read and accept a request as it arrives; decide it when a funnel applies.
        Never raises (``Failing.guarded``)."""
        return self.failing.guarded(self._receive, request)

    def _receive(self, request: Any) -> Any:
        delivery = delivery_of(request, self.runtime.countdowns)
        try:
            charges = self.charges.of(request.type, request.name, request.args, request.kwargs)
            slot_funnels = self.slot_funnels.of(
                request.type, request.name, request.args, request.kwargs
            )
        except Exception as error:  # a bad funnel_key fails its task only
            return self.failing.fail(request, error, False)
        state = State.from_headers(request.request_dict)
        if not delivery.unchecked(state.release):
            delivery.accepted = True
            if not charges and not slot_funnels and not follows_of(request.request_dict):
                return self.handle(request)
        return self._arrived(request, charges, slot_funnels, state, delivery)

    def _pass(self, request: Any, charges: Sequence[Charge], state: State) -> Any:
        """Decide a held request again (its timer fired, or it was woken): its charges
        stay the code's; its slots and subject are read anew. Never raises."""
        return self.failing.guarded(self._again, request, charges, state)

    def _again(self, request: Any, charges: Sequence[Charge], state: State) -> Any:
        try:
            slot_funnels = self.slot_funnels.of(
                request.type, request.name, request.args, request.kwargs
            )
        except Exception as error:  # a bad funnel_key fails its task only
            return self.failing.fail(request, error, False)
        delivery = delivery_of(request, self.runtime.countdowns)
        return self._arrived(request, charges, slot_funnels, state, delivery)

    def _arrived(
        self, request: Any, charges: Sequence[Charge], slot_funnels: Any, state: State,
        delivery: Delivery,
    ) -> Any:  # fmt: skip
        try:
            # only a fair-share charge has a fair step (asking for it asks if tasks may
            # be parked, which reads the funnels' Redis now and then)
            fair = self.parking.fair_step(request.id) if any(c.fair for c in charges) else None
            subject = subject_of(request, self.options, fair, self.transport)
        except Exception as error:  # a bad option value fails its task only
            return self.failing.fail(request, error, False)
        return self._run(Arrival(request, charges, slot_funnels, state, subject, delivery))

    def _run(self, arrival: Arrival) -> Any:
        """Decide ``arrival`` now: its copy, slots, then the funnels; run, wait or fail it."""
        request = arrival.request
        if request.revoked():  # revoked, or expired while it waited: Celery ends it
            self.held.backend_of(request)  # revoked() stored REVOKED with it
            cancel_run_booking(self.runtime, arrival.charges, arrival.state, request.id)
            self.slot_funnels.forget(request)
            return None
        if not arrival.delivery.accepted:
            return self._accept(arrival)
        holder = follows_of(request.request_dict)
        if holder:  # a unique task's follower: waits, completes, or runs as its own
            following = self._follow(arrival, holder)
            if following is not OWN:
                return following
        lease: Lease | None = None
        try:
            if arrival.slot_funnels:  # the slots first: they can be given back, a rate's cannot
                lease, waits = self.seats.take(arrival)
                if lease is None:
                    return waits
            step = self.decisions.spend(arrival) if lease is None else None  # a unit held
            if step is None and lease is None and arrival.charges and self.decisions.send(arrival):
                return None  # carried on by ``decided`` when the reply comes
            if step is None:
                step = self._decide(arrival) if arrival.charges else RUN
        except Exception as error:  # one task fails, the worker runs on
            if lease is not None:
                self.slot_funnels.free(lease)
            return self.failing.fail(request, error, False)
        return self._decided(arrival, step, lease)

    def _accept(self, arrival: Arrival) -> Any:
        """Check ``arrival``'s copy: go on (decide it), drop it (a stale copy), or, when
        the funnels' Redis cannot say or another send of its task id goes first, wait
        and check again (never run unchecked)."""
        request = arrival.request
        verdict = self.copies.accept(request, arrival.state)
        if verdict is True:
            arrival.delivery.accepted = True
            return self._run(arrival)
        if verdict is False:
            ack(request)
            return None
        return self.waits.recheck(arrival, verdict)

    def _follow(self, arrival: Arrival, holder: str) -> Any:
        """A follower of ``holder`` (``follow``): ``OWN`` when it runs its own body (it
        holds the key), else what the gate returns (it waits, or completes)."""
        try:
            step = self.follow.step(arrival.request, holder)
        except BackendError:  # the funnels' Redis fails: it waits (outage back-off)
            return self.waits.wait(arrival, waiting(self.runtime, arrival.state))
        if step is Next.OWN:
            return OWN
        if step is Next.WAIT:
            return self.waits.wait(arrival, Follow.waiting(arrival.state))
        Follow.complete(arrival.request)
        return self._admit(arrival, None)

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
        self.live.count(labels_of(arrival.charges), step.run)
        if step.run:
            return self._admit(arrival, lease)
        self.inflight.deferred()
        if lease is not None:  # a rate refused it: nothing stays charged
            self.slot_funnels.free(lease)
        if step.error is not None:
            return self.failing.fail(arrival.request, step.error, True)
        return self.waits.wait(arrival, step)

    def _admit(self, arrival: Arrival, lease: Lease | None) -> Any:
        """Run the request: the run is decided and paid (``FunnelTask.before_start``
        sees the gate's mark and lets it through). Past its delivery's deadline the
        broker may have given the message to another worker already: handed back."""
        request = arrival.request
        if arrival.delivery.past_deadline():
            if lease is not None:
                self.slot_funnels.free(lease)
            self.held.forget(request)
            return hand_back(request, "its delivery's deadline passed before it could start")
        more = lease.header() if lease is not None else {}
        request.request_dict[HEADER] = arrival.state.header(gate=gate_mark(), **more)
        self.copies.watch_ack(request, arrival.state)
        if lease is not None:
            self.slot_funnels.started(lease, request)
        return self.handle(request)

    def _no_reply(self, error: BaseException) -> None:
        """The decisions in flight got no reply in time: the funnels' Redis fails."""
        self.runtime.outage.failed(error, self.runtime.settings.on_backend_error)

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
        self.window.forget()
        return self.held.drop() + self.inflight.drop()

    def connection_lost(self) -> None:
        """The broker connection died: the runs started from messages not acked yet
        are recorded (``CopyGuard.runs_cut``) before the broker gives them again."""
        self.copies.runs_cut()

    def close(self) -> None:
        """Stop sweeping; give back the slots still held; close the result-backend
        connections the gate opened."""
        self.held.close()
        self.slot_funnels.close()
        self.inflight.close()
