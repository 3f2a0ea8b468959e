"""The worker gate: the single gate of every task a worker with celery-funnel installed
receives, FunnelTask or not, where every due task passes: ``consumer.on_task_request``.

It charges the task's own funnels (FunnelTask options) and every matching worker-wide
``funnel_limits`` entry in one decision (``_gate.judge``), and marks the runs it admits
so that ``FunnelTask.before_start`` does not charge them again. A task it defers never
reaches the pool: no ``STARTED`` state, no ``task_prerun``, no "ignored" log line.

It runs on the consumer's event loop, so it never sleeps: a refused task is held on the
consumer's timer (as Celery holds ETA tasks) for exactly the time the funnel names, its
slot booked under the task id, when that fits in what the broker allows an un-acked
message (``_countdown``); a longer wait is published again once, with the capped
countdown and everything it was sent with, and the original is acked after the publish.
Held requests are dropped when the broker connection closes, as Celery drops its ETA
timers: the broker delivers them again. Any error in the gate fails that one task.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from celery import bootsteps
from celery.worker.state import task_ready

from .._config.options import concurrency_of, dry_run_of, policy_of
from .._config.runtime import Runtime, runtime_for
from .._gate.charges import Charges
from .._gate.held import Held, give_back_booking
from .._gate.inflight import InFlight
from .._gate.inflight_steps import InFlightSteps
from .._gate.judge import HEADER, RUN, Charge, State, Step, Subject, gate_mark, judge, label_of
from .._gate.live import live_for
from .._gate.parking import Parking
from .._gate.requests import fail_request, until_expiry
from .._gate.seats import Seats
from .._gate.slots import SlotWaits
from .._gate.waits import WaitSteps
from .._limiter.errors import ConfigurationError
from .._limiter.keys import safe_part
from .._limiter.limit import Limit
from .._stores.leases import Lease
from .checks import check_app, refuse_start
from .task import FunnelTask, limits_of

__all__ = ["FunnelGate", "WorkerGate"]

logger = logging.getLogger("celery_funnel")


class WorkerGate(SlotWaits, InFlightSteps, WaitSteps):
    """Wraps ``on_task_request``: passes a request on once every funnel that applies to
    it admits it; holds, re-publishes or fails it otherwise."""

    def __init__(self, runtime: Runtime, consumer: Any, handle: Callable[[Any], Any]) -> None:
        self.runtime = runtime
        self.consumer = consumer
        self.handle = handle
        self.node = getattr(consumer, "hostname", "") or ""
        self.hostname = safe_part(self.node or "worker")
        self.charges = Charges(runtime, consumer.app, self.hostname)
        self.held = Held(runtime, consumer, self._pass)
        self.parking = Parking(runtime)
        self.live = live_for(consumer.app)
        self.seats = Seats(runtime, consumer.app, self.node, self.hostname)
        self.inflight = InFlight(lambda: runtime.funnel, getattr(consumer, "hub", None))
        self.calls = {}

    def limits_for(self, name: str) -> tuple[Limit, ...]:
        """Every worker-wide limit whose pattern matches task ``name``."""
        return self.charges.worker_limits(name)

    def __call__(self, request: Any) -> Any:
        try:
            charges = self.charges.of(request.type, request.name, request.args, request.kwargs)
            seated = bool(self.seats.of(request.type, request.name, request.args, request.kwargs))
        except Exception as error:  # a bad funnel_key fails its task only
            return self._fail(request, error, reported=False)
        state = State.from_headers(request.request_dict)
        if not self.parking.accept(request, state):  # a copy of a release that ran
            request.acknowledge()
            task_ready(request)
            return None
        if not charges and not seated:
            return self.handle(request)
        return self._pass(request, charges, state)

    def _subject(self, request: Any) -> Subject:
        settings = self.runtime.settings
        task = request.task
        until = until_expiry(request)
        expires_in = None if math.isinf(until) else until
        if isinstance(task, FunnelTask):
            policy = policy_of(task, settings.on_backend_error)
            dry_run = dry_run_of(task, settings.dry_run)
        else:
            policy, dry_run = settings.on_backend_error, settings.dry_run
        fair = self.parking.fair_step(request.id)
        return Subject(request.name, request.id, policy, dry_run, expires_in=expires_in, fair=fair)

    def _pass(self, request: Any, charges: Sequence[Charge], state: State) -> Any:
        """Decide ``request`` now: run it, hold it, publish it again, or fail it."""
        self.held.backend_of(request)  # revoked() below may store REVOKED with it
        if request.revoked():  # revoked, or expired while it waited: Celery ends it
            give_back_booking(self.runtime, charges, state, request.id)
            self.seats.forget(request)
            return None
        lease: Lease | None = None
        try:
            seats = self.seats.of(request.type, request.name, request.args, request.kwargs)
            if seats:  # the slots first: they can be given back, a rate's cannot
                lease, waits = self._take_slots(request, charges, state, seats)
                if lease is None:
                    return waits
            if lease is None and charges and self._send(request, charges, state):
                return None  # carried on by _resume when the reply comes
            # charges stay the code's (held requests keep them); overrides apply here,
            # to every decision, from the table the live thread keeps fresh
            step = self._decide(request, charges, state) if charges else RUN
        except Exception as error:  # one task fails, the worker runs on
            if lease is not None:
                self.seats.give_back(lease)
            return self._fail(request, error, reported=False)
        return self._decided(request, charges, state, step, lease)

    def _decided(
        self,
        request: Any,
        charges: Sequence[Charge],
        state: State,
        step: Step,
        lease: Lease | None,
    ) -> Any:
        """Act on ``step``: run the request, hold, publish it again, or fail it."""
        self.live.count(dict.fromkeys(c.label for c in charges), step.run)
        if not step.run:
            self.inflight.deferred()
        if step.run:
            # the run is decided and paid: FunnelTask.before_start lets it through
            more = lease.header() if lease is not None else {}
            request.request_dict[HEADER] = state.header(gate=gate_mark(), **more)
            if lease is not None:
                self.seats.started(lease, request)
            return self.handle(request)
        if lease is not None:  # a rate refused it: nothing stays charged
            self.seats.give_back(lease)
        if step.error is not None:
            return self._fail(request, step.error, reported=True)
        return self._wait(request, charges, step)

    def _decide(self, request: Any, charges: Sequence[Charge], state: State) -> Step:
        """``judge`` under the overrides in force (a paused funnel's task waits)."""
        paused = self.live.paused_step(charges, state, parked=self.parking.on)
        if paused is not None:
            return paused
        return judge(
            self.runtime, self._subject(request), self.live.overrides.apply(charges), state
        )

    def waiting(self) -> dict[str, int]:
        """How many requests this worker holds, per funnel label."""
        return dict(Counter(label_of(charges) for charges in self.held.charges()))

    def drop_held(self) -> int:
        """Forget every held request, and those whose decision is in flight (the broker
        connection closed: it delivers them again). Returns how many."""
        return self.held.drop() + self.inflight.drop()

    def _fail(self, request: Any, error: BaseException, *, reported: bool) -> None:
        """Fail ``request`` with ``error`` as Celery fails a task (FAILURE stored,
        errbacks, ``task_failure``, ``task-failed``), ack it, and log one line."""
        if not reported:
            logger.error(
                "celery-funnel: task %s[%s] failed in the gate: %s: %s",
                request.name, request.id, type(error).__name__, error,
            )  # fmt: skip
        self.held.forget(request.id)
        self.held.backend_of(request)
        fail_request(request, error)

    def close(self) -> None:
        """Stop sweeping; give back the slots still held; close the result-backend
        connections the gate opened."""
        self.held.close()
        self.seats.close()
        self.inflight.close()

    def _send_event(self, request: Any) -> Callable[..., Any] | None:
        dispatcher = getattr(self.consumer, "event_dispatcher", None)
        if dispatcher is None or not dispatcher.enabled:
            return None

        def send(type_: str, **fields: Any) -> None:
            dispatcher.send(type_, uuid=request.id, **fields)

        return send


def check_tasks(app: Any) -> None:
    """Check every setting and task of ``app`` (``_checks.check_app``), so that bad
    options fail at worker start, named."""
    check_app(app)


class FunnelGate(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: checks the settings and every FunnelTask's options (a bad
    value stops the worker at start, named), and installs the worker gate when
    ``funnel_limits`` is set or a FunnelTask is registered; drops the requests the gate
    holds when the broker connection closes (``stop``, as the consumer restarts)."""

    label = "celery-funnel gate"

    def shutdown(self, consumer: Any) -> None:
        gate = consumer.on_task_request
        if isinstance(gate, WorkerGate):
            gate.close()
        runtime_for(consumer.app).close()

    def stop(self, consumer: Any) -> None:
        gate = consumer.on_task_request
        if isinstance(gate, WorkerGate):
            gate.drop_held()

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        try:
            check_tasks(consumer.app)
        except ConfigurationError as error:
            refuse_start(consumer, error)
            raise
        runtime = runtime_for(consumer.app)
        settings = runtime.settings
        if settings.limits:
            settings.require_redis()
        if settings.limits or settings.concurrency or _funnel_tasks(consumer.app):
            gate = WorkerGate(runtime, consumer, consumer.on_task_request)
            gate.parking.start()  # funnel_park=True on a Redis without AOF stops here
            consumer.on_task_request = gate
        if settings.limits:
            logger.info(
                "celery-funnel: worker-wide limits on %s",
                ", ".join(f"{limit.pattern}={limit.rate}" for limit in settings.limits),
            )
        if settings.redis_url:  # one log line per problem of the funnels' Redis
            runtime.check_backend()


def _funnel_tasks(app: Any) -> bool:
    """Whether ``app`` has a FunnelTask with a funnel (the gate decides its runs)."""
    return any(
        isinstance(t, FunnelTask) and (limits_of(t) or concurrency_of(t) is not None)
        for t in list(app.tasks.values())
    )
