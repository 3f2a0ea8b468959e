"""The worker gate: worker-wide limits (``funnel_limits``) for every matching task,
FunnelTask or not, enforced where every due task passes: ``consumer.on_task_request``.

It runs on the consumer's event loop, so it never sleeps: a refused task is held on the
consumer's timer (as Celery's own rate limit holds it) for exactly the time the funnel
names, its slot booked under the task id, and then passes the gate again. Redis calls
have bounded socket timeouts (``funnel_socket_timeout``).
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.worker.state import task_ready

from ._checks import check_app
from ._errors import BackendError
from ._limit import Limit, Verdict, safe_part
from ._outage import backoff
from ._runtime import Runtime, runtime_for

__all__ = ["FunnelGate", "WorkerGate"]

logger = logging.getLogger("celery_funnel")


class WorkerGate:
    """Wraps ``on_task_request``: passes a request on once every matching limit admits it.

    A refused request books its slot under its task id and is held on the consumer's
    timer until then. A message must not stay un-acked past the broker's limit (the
    Redis transport's visibility timeout would deliver it again), so a request held
    for the countdown cap in all is given back to the broker instead; whichever worker
    receives it next redeems the same booking (the ticket is the task id, in Redis).
    """

    def __init__(self, runtime: Runtime, consumer: Any, handle: Callable[[Any], Any]) -> None:
        self.runtime = runtime
        self.consumer = consumer
        self.handle = handle
        self.hostname = safe_part(getattr(consumer, "hostname", "") or "worker")
        self._by_name: dict[str, tuple[Limit, ...]] = {}
        self._passed: dict[str, set[int]] = {}  # request id -> indexes of limits passed
        self._held_since: dict[str, float] = {}  # request id -> when it was first held
        self._outages: dict[str, int] = {}  # request id -> back-offs in a row
        self._holds: dict[str, int] = {}  # request id -> times held by this worker

    def limits_for(self, name: str) -> tuple[Limit, ...]:
        """Every worker-wide limit whose pattern matches task ``name``."""
        if name not in self._by_name:
            self._by_name[name] = tuple(
                limit
                for limit in self.runtime.settings.limits
                if limit.pattern is not None and fnmatch.fnmatchcase(name, limit.pattern)
            )
        return self._by_name[name]

    def key(self, limit: Limit) -> str:
        worker = self.hostname if limit.scope == "worker" else ""
        return self.runtime.limit_key(limit.pattern, worker)

    def __call__(self, request: Any) -> Any:
        limits = self.limits_for(request.name)
        if not limits:
            return self.handle(request)
        return self._check(request, limits)

    def _check(self, request: Any, limits: tuple[Limit, ...]) -> Any:
        passed = self._passed.setdefault(request.id, set())
        settings, observer = self.runtime.settings, self.runtime.observer
        dry_run = settings.dry_run
        for index, limit in enumerate(limits):
            if index in passed:
                continue
            gcra = limit.strategy == "gcra"
            ticket = request.id if settings.reservation and gcra and not dry_run else None
            try:
                # always redeem: the booking may have been made by another worker
                verdict = limit.check(
                    self.runtime.funnel,
                    self.key(limit),
                    1,
                    ticket=ticket,
                    redeem=ticket is not None,
                )
            except BackendError as error:
                verdict = self._outage(request, error)
            else:
                self.runtime.outage.answered()
                self._outages.pop(request.id, None)
            funnel = f"limit:{limit.pattern}"
            if verdict.run:
                observer.admitted(request.name, request.id, funnel, dry_run=dry_run)
            elif dry_run:  # report it, and let it through
                observer.deferred(request.name, request.id, funnel, verdict.delay, dry_run=True)
            else:
                self._hold(request, limits, verdict, funnel)
                return None
            passed.add(index)
        self._forget(request)
        return self.handle(request)

    def _outage(self, request: Any, error: BackendError) -> Verdict:
        """The funnel's Redis failed: "allow" lets the request through; "defer" (and
        "raise", as there is no task to fail here) holds it for a back-off."""
        policy = self.runtime.settings.on_backend_error
        self.runtime.outage.failed(error, policy)
        if policy == "allow" or self.runtime.settings.dry_run:
            return Verdict(run=True)
        attempt = self._outages.get(request.id, 0)
        self._outages[request.id] = attempt + 1
        return Verdict(run=False, delay=backoff(attempt, self.runtime.countdowns.cap), outage=True)

    def _forget(self, request: Any) -> None:
        self._passed.pop(request.id, None)
        self._held_since.pop(request.id, None)
        self._outages.pop(request.id, None)
        self._holds.pop(request.id, None)

    def _hold(self, request: Any, limits: tuple[Limit, ...], verdict: Verdict, funnel: str) -> None:
        policy = self.runtime.countdowns
        delay = verdict.delay
        since = self._held_since.setdefault(request.id, time.monotonic())
        budget = policy.cap - (time.monotonic() - since)
        requeue = delay > budget
        holds = self._holds[request.id] = self._holds.get(request.id, 0) + 1
        self.runtime.observer.deferred(
            request.name, request.id, funnel, delay, deferrals=holds,
            booked=verdict.booked, outage=verdict.outage, requeued=requeue,
            send_event=self._send_event(request),
        )  # fmt: skip
        if requeue:
            # held long enough: back to the broker before its un-acked limit
            self._forget(request)
            task_ready(request)
            request.reject(requeue=True)
            return
        # Like an ETA task: held in this worker, outside the prefetch window, so that
        # other tasks keep flowing while it waits.
        self.consumer.qos.increment_eventually()
        self.consumer.timer.call_after(
            policy.countdown(delay), self._release, (request, limits), priority=6
        )

    def _send_event(self, request: Any) -> Callable[..., Any] | None:
        dispatcher = getattr(self.consumer, "event_dispatcher", None)
        if dispatcher is None or not dispatcher.enabled:
            return None

        def send(type_: str, **fields: Any) -> None:
            dispatcher.send(type_, uuid=request.id, **fields)

        return send

    def _release(self, request: Any, limits: tuple[Limit, ...]) -> None:
        self.consumer.qos.decrement_eventually()
        self._check(request, limits)


def check_tasks(app: Any) -> None:
    """Check every setting and task of ``app`` (``_checks.check_app``), so that bad
    options fail at worker start, named."""
    check_app(app)


class FunnelGate(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: checks the settings and every FunnelTask's options (a bad
    value stops the worker at start, named), and installs the worker gate when
    ``funnel_limits`` is set."""

    label = "celery-funnel gate"

    def shutdown(self, consumer: Any) -> None:
        runtime_for(consumer.app).close()

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        check_tasks(consumer.app)
        runtime = runtime_for(consumer.app)
        settings = runtime.settings
        if settings.limits:
            settings.require_redis()
            consumer.on_task_request = WorkerGate(runtime, consumer, consumer.on_task_request)
            logger.info(
                "celery-funnel: worker-wide limits on %s",
                ", ".join(f"{limit.pattern}={limit.rate}" for limit in settings.limits),
            )
        if settings.redis_url:  # one log line per problem of the funnels' Redis
            runtime.check_backend()
