"""The requests the worker gate holds on the consumer's timer, like ETA tasks: dropped
when the broker connection closes, and swept once a second for revoked ones, which end
at once (as Celery ends revoked tasks) and give the slot they booked back, and for ones
past their delivery's deadline (a timer that fires late: a stalled event loop), which
go back to the broker.

A held request is the first argument of its timer entry and leaves the worker's
reserved set while it waits, as Celery's ETA tasks do: ``celery inspect scheduled``
lists it, with the time it is decided again as its ``eta``, and ``inspect reserved``
does not."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from celery.worker import state as worker_state
from celery.worker.state import reserved_requests, task_ready, task_reserved
from celery.worker.state import revoked as revoked_tasks

from .._config.runtime import Runtime
from .._limiter.strategies import capabilities
from .._shared.charges import Charge
from .._shared.charges_decide import joint
from .._shared.delivery import hand_back, overdue
from .._shared.state import State
from .._stores.give_back import CancelOp
from .nudge import Nudge

__all__ = ["Held", "cancel_run_booking"]

logger = logging.getLogger("celery_funnel")

SWEEP_SECONDS = 1.0
Release = Callable[[Any, Sequence[Charge], State], Any]


def cancel_run_booking(
    runtime: Runtime, charges: Sequence[Charge], state: State, ticket: str
) -> None:
    """Cancel the booking ``ticket`` holds (on the funnels not yet passed), if any;
    a failure is logged, never raised (the slot then passes unused)."""
    pending = [
        c for i, c in enumerate(charges)
        if c.cost > 0 and i not in state.passed and capabilities(c.limit.strategy).books
    ]  # fmt: skip
    if not state.booked or not pending:
        return
    if not joint(runtime, pending):
        pending = pending[:1]  # booked one at a time: the first one pending holds it
    shapes = [
        (c.limit.capacity - 1, c.limit.rate.count, c.limit.rate.period, c.cost) for c in pending
    ]
    try:
        runtime.funnel.decide([CancelOp([c.key for c in pending], shapes, ticket)])
    except Exception as error:  # the slot passes unused: no worse than not trying
        logger.warning("celery-funnel: could not give back the slot of %s: %r", ticket, error)


class Held:
    """Requests held on ``consumer``'s timer until ``release(request, charges, state)``."""

    def __init__(self, runtime: Runtime, consumer: Any, release: Release) -> None:
        self.runtime, self.consumer, self.release = runtime, consumer, release
        # by request (id()), not task id: two messages of one task id may be held at once
        # (two sends of it, or a copy and the original delivered again)
        self._held: dict[int, tuple[Any, Any, Sequence[Charge], State]] = {}
        self._etas: dict[int, Any] = {}  # the eta each held request came with
        self._sweeper: Any = None
        self.nudge = Nudge(consumer)  # wakes held requests from other threads, at once
        # the result backends used to end tasks here (Celery keeps one per thread)
        self.backends: dict[int, Any] = {}

    def backend_of(self, request: Any) -> None:
        """Remember the result backend ending ``request`` uses in this thread."""
        backend = request.task.backend
        self.backends[id(backend)] = backend

    def __len__(self) -> int:
        return len(self._held)

    def listed(self) -> list[tuple[Any, Sequence[Charge], State]]:
        """Every held request, its charges and header state (a copy)."""
        return [(entry[0], entry[2], entry[3]) for entry in list(self._held.values())]

    def charges(self) -> list[Sequence[Charge]]:
        """The charges of every held request (read from another thread: a copy)."""
        return [entry[2] for entry in list(self._held.values())]

    def hold(self, request: Any, charges: Sequence[Charge], state: State, delay: float) -> None:
        """Hold ``request`` for ``delay`` seconds, outside the prefetch window (so that
        other tasks keep flowing while it waits), as Celery holds ETA tasks."""
        timer = self.consumer.timer
        self.nudge.watch()  # on the loop: a wake from another thread reaches it at once
        self.consumer.qos.increment_eventually()
        entry = timer.call_after(delay, self._due, (request,), priority=6)
        self._held[id(request)] = (request, entry, charges, state)
        self._etas.setdefault(id(request), _scheduled(request, delay))
        if self._sweeper is None:
            self._sweeper = timer.call_repeatedly(SWEEP_SECONDS, self.sweep, priority=6)

    def forget(self, request: Any) -> None:
        """Stop holding ``request`` (it is being failed or passed on)."""
        held = self._held.pop(id(request), None)
        if held is not None:
            self.consumer.timer.cancel(held[1])
            self.consumer.qos.decrement_eventually()
            self._reserved(held[0])

    def _reserved(self, request: Any) -> None:
        """``request`` waits no more: back in the reserved set, with its own eta."""
        _set_eta(request, self._etas.pop(id(request), None))
        task_reserved(request)

    def _due(self, request: Any) -> None:
        held = self._held.get(id(request))
        if held is None or held[0] is not request:
            return  # dropped with its connection, or revoked
        del self._held[id(request)]
        _request, _entry, charges, state = held
        self.consumer.qos.decrement_eventually()
        self._reserved(request)
        self.release(request, charges, state)

    def wake(self, labels: set[str]) -> None:
        """Decide again now every held request charged by a funnel of ``labels`` (their
        limits changed). Safe from another thread: the requests are woken on the event
        loop, at once (``Nudge``)."""
        self.nudge.call(self._wake, frozenset(labels))

    def wake_tasks(self, task_ids: list[str]) -> None:
        """Decide again now the held requests of ``task_ids`` (a seat was handed to
        them: held waiters). Safe from another thread, as ``wake``."""
        self.nudge.call(self._wake_tasks, tuple(task_ids))

    def _wake_tasks(self, task_ids: tuple[str, ...]) -> None:
        woken = set(task_ids)
        for request, _entry, charges, state in list(self._held.values()):
            if request.id in woken:
                self.forget(request)
                self.release(request, charges, state)

    def _wake(self, labels: frozenset[str]) -> None:
        for request, _entry, charges, state in list(self._held.values()):
            if any(charge.label in labels for charge in charges):
                self.forget(request)
                # a slot booked under the old limit is not redeemed: it decides anew
                self.release(request, charges, state._replace(booked=False))

    def sweep(self) -> None:
        """End every held request that was revoked meanwhile, giving its slot back; hand
        back every one past its delivery's deadline."""
        now = time.monotonic()
        # list() copies at once: without an event loop the timer runs on its own thread
        for request, _entry, charges, state in list(self._held.values()):
            if request.id in revoked_tasks:
                self.forget(request)
                cancel_run_booking(self.runtime, charges, state, request.id)
                self.backend_of(request)
                request.revoked()  # REVOKED, task_revoked, acked: as Celery ends them
            elif overdue(request, now):
                self.forget(request)
                hand_back(request, "held past its delivery's deadline")

    def drop(self) -> int:
        """Forget every held request: the broker connection they came on is gone, and
        the broker delivers them again (to this worker or another). Returns how many."""
        held, self._held = self._held, {}
        for request, entry, _charges, _state in held.values():
            self.consumer.timer.cancel(entry)
            _set_eta(request, self._etas.pop(id(request), None))
            task_ready(request)  # forgotten by the worker too (not a reserved one)
        if held:
            logger.info(
                "celery-funnel: the broker connection closed; %d held task(s) dropped,"
                " the broker delivers them again", len(held),
            )  # fmt: skip
        return len(held)

    def close(self) -> None:
        """Stop the sweeper and close the result-backend connections opened to end
        tasks here (the worker shuts down)."""
        if self._sweeper is not None:
            self.consumer.timer.cancel(self._sweeper)
            self._sweeper = None
        self.nudge.close()
        backends, self.backends = self.backends, {}
        for backend in backends.values():
            pool = getattr(getattr(backend, "client", None), "connection_pool", None)
            if pool is not None:
                pool.disconnect()


def _scheduled(request: Any, delay: float) -> Any:
    """Show ``request`` as scheduled ``delay`` seconds from now (``inspect
    scheduled`` reads a timer entry's request and its ``eta``), not reserved; the eta
    it came with is returned, to be put back."""
    reserved_requests.discard(request)
    scheduled = getattr(worker_state, "task_scheduled", None)  # newer Celery only
    if scheduled is not None:  # ``inspect query_task`` then says "scheduled", not "ready"
        scheduled(request)
    own = getattr(request, "_eta", None)
    now = datetime.datetime.now(datetime.timezone.utc)
    _set_eta(request, now + datetime.timedelta(seconds=delay))
    return own


def _set_eta(request: Any, eta: Any) -> None:
    """``request.eta`` (Celery's ``Request`` keeps it in ``_eta``; any other has none)."""
    if hasattr(request, "_eta"):
        request._eta = eta
