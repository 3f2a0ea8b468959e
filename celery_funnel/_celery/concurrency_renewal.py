"""The renewal service: the leases of one app in one process, the ones this worker's
gate took, renewed by one thread in one call per interval, and freed when their runs
end (the gate is handed ``renewal_for`` by ``_celery.services``).

Where a run's end is seen is ``_celery.concurrency_signals``'. Each tick of the renewer
also frees the leases of requests the worker no longer knows (an ending no signal
reported), and a warm shutdown frees whatever is still held. A lease
given back twice is given back once (task id and token). A give-back that fails (the
funnels' Redis down) is tried again every second by the same thread until it works,
so a seat returns when Redis does, not a TTL later. Seats freed go to the oldest
parked waiters, which the freeing process publishes at once (``hand_on``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from celery.worker import state as worker_state

from .._config.runtime import runtime_for
from .._limiter.errors import BackendError
from .._limiter.keys import hash_tag
from .._stores.concurrency import ConcurrencyFunnel, ConcurrencyStore, Handed, Lease
from .release import publish

__all__ = ["ATTRIBUTE", "RenewalService", "alive", "renewal_for"]

logger = logging.getLogger("celery_funnel")
ATTRIBUTE = "_celery_funnel_leases"
ERROR_PAUSE_SECONDS = 1.0


class RenewalService:
    """The renewal service of ``app`` in this process (``worker``: its node name): the
    leases of the seats this process's gate took, renewed until their runs end."""

    def __init__(self, app: Any, worker: str = "") -> None:
        runtime = runtime_for(app)
        settings = runtime.settings
        client = runtime.funnel.client
        self.app, self.worker, self.pid = app, worker, os.getpid()
        self.store = ConcurrencyStore(client, settings.key_prefix, settings.lease_ttl)
        self.park_lease = settings.park_lease
        self.interval, self.ttl = settings.lease_ttl / 3, settings.lease_ttl
        # task id -> the lease this process's gate took, and its request (weakly)
        self._held: dict[str, tuple[Lease, Callable[[], Any]]] = {}
        self._funnels: dict[str, ConcurrencyFunnel] = {}  # swept at each renewal
        # (task id, token) -> a lease whose give-back failed, and until when (monotonic
        # s) one that may not exist yet (its taking timed out) is looked for
        self._owed: dict[tuple[str, str], tuple[Lease, float]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, lease: Lease, request: Any) -> None:
        """Renew ``lease`` until the run of ``request`` (a worker Request) ends."""
        with self._lock:
            self._held[lease.task_id] = (lease, weakref.ref(request))
        self.know(lease.funnels)

    def know(self, funnels: Iterable[ConcurrencyFunnel]) -> None:
        """Sweep these funnels for leases that ran out, at each renewal."""
        with self._lock:
            for funnel in funnels:
                self._funnels[funnel.key] = funnel
            self._start()

    def _start(self) -> None:
        """Start the thread (under the lock), once."""
        if self._thread is None and not self._stopped.is_set():
            self._thread = threading.Thread(target=self._run, name="celery-funnel-leases")
            self._thread.daemon = True
            self._thread.start()

    def end(self, task_id: str, lease: Lease | None = None, *, force: bool = False) -> None:
        """A run of ``task_id`` ended: give its seats back (``lease``: from its header;
        else the one this process took, if its request is done: a signal about another
        copy of the task, delivered again, leaves a running one alone; ``force``: in any
        case). Never raises."""
        with self._lock:
            held = self._held.get(task_id)
            if held is not None and (lease or force or not alive(held[1])):
                del self._held[task_id]
            elif lease is None:
                return
        lease = lease or (held[0] if held else None)
        if lease is None:
            return
        try:
            self.hand_on(self.store.free(lease.funnels, task_id, lease.token)[1])
        except Exception as error:  # tried again each second (or it runs out after its TTL)
            logger.warning(
                "celery-funnel: could not give back the slot of task %s (tried again): %r",
                task_id, error,
            )  # fmt: skip
            with self._lock:
                self._owed[task_id, lease.token] = (lease, 0.0)
                self._start()

    def owe(self, lease: Lease) -> None:
        """Taking ``lease`` timed out: the call may have run (its reply lost, or sent
        late over a network that hung) and hold seats no run will give back. Give it
        back as soon as Redis answers, and for a TTL after, should the call come late
        (giving back a lease that does not exist does nothing)."""
        with self._lock:
            self._owed[lease.task_id, lease.token] = (lease, time.monotonic() + self.ttl)
            self._start()

    def _pay_owed(self) -> None:
        """Give back the leases whose give-back failed, as long as it works.

        Raises:
            BackendError: when Redis fails (the rest are tried again later).
        """
        with self._lock:
            owed = list(self._owed.items())
        for key, (lease, look_until) in owed:
            task_id = lease.task_id
            try:
                given, handed = self.store.free(lease.funnels, task_id, lease.token)
                self.hand_on(handed)
                if not given and time.monotonic() < look_until:
                    continue  # not taken (yet): looked for again at the next tick
            except BackendError:
                raise  # Redis fails still: all of them later
            except Exception as error:  # not Redis: the lease runs out after its TTL
                logger.warning("celery-funnel: giving back the slot of task %s failed: %r",
                               task_id, error)  # fmt: skip
            with self._lock:
                self._owed.pop(key, None)

    def hand_on(self, handed: list[Handed]) -> None:
        """Publish the parked waiters ``handed`` a seat, each saying where (a waiter
        received by a worker that counts other funnels, ``"scope": "worker"``, gives
        those seats up); a waiter no longer parked gives its seat to the next one.

        Raises:
            BackendError: when Redis fails (a claimed waiter is published by a releaser
                once its claim runs out; a seat handed on runs out after the TTL).
        """
        while handed:
            where: dict[str, list[ConcurrencyFunnel]] = {}
            for funnel, task_id in handed:
                where.setdefault(task_id, []).append(funnel)
            missing, releases = self.store.wake(list(where), self.park_lease)
            for release in releases:  # the entry goes when a worker accepts the copy
                publish(self.app, release, promised=where[release.task_id])
            handed = []
            for task_id in missing:
                handed += self.store.free(where[task_id], task_id, "")[1]

    def tick(self) -> None:
        """Renew every lease held, give back those of runs the worker forgot, sweep
        the known funnels, and publish the waiters handed a seat: one call (one per
        hash tag on a Redis Cluster). The give-backs that failed go first."""
        self._pay_owed()
        with self._lock:
            held = list(self._held.values())
            funnels = list(self._funnels.values())
        for lease, request in held:
            if not alive(request):
                self.end(lease.task_id)  # an ending no signal reported
        with self._lock:
            tokens = {task_id: lease.token for task_id, (lease, _) in self._held.items()}
            pairs: dict[str, list[tuple[str, str]]] = {}
            for lease, _ in self._held.values():
                for funnel in lease.funnels:
                    pairs.setdefault(funnel.key, []).append((lease.task_id, lease.token))
        for group in self._groups(funnels):
            renewed = self.store.renew(group, pairs)
            with self._lock:
                for _, task_id in renewed.gone:  # given back by the process that ran it
                    entry = self._held.get(task_id)
                    if entry is not None and entry[0].token == tokens.get(task_id):
                        del self._held[task_id]
                used = {s.key for lease, _ in self._held.values() for s in lease.funnels}
                for key in renewed.empty:
                    if key not in used:
                        self._funnels.pop(key, None)
            self.hand_on(renewed.promoted)

    def _groups(self, funnels: list[ConcurrencyFunnel]) -> list[list[ConcurrencyFunnel]]:
        """The funnels in groups one script may touch: all at once on one Redis, one
        group per hash tag on a Redis Cluster."""
        if "Cluster" not in type(self.store.client).__name__:
            return [funnels] if funnels else []
        groups: dict[str | None, list[ConcurrencyFunnel]] = {}
        for funnel in funnels:
            groups.setdefault(hash_tag(funnel.key), []).append(funnel)
        return list(groups.values())

    def _run(self) -> None:
        pause = ERROR_PAUSE_SECONDS if self._owed else self.interval
        while not self._stopped.wait(pause):
            try:
                self.tick()
                pause = ERROR_PAUSE_SECONDS if self._owed else self.interval
            except Exception as error:  # tried again soon; the leases last the TTL
                level = logging.INFO if isinstance(error, BackendError) else logging.ERROR
                logger.log(level, "celery-funnel: renewing leases failed: %r", error)
                pause = min(ERROR_PAUSE_SECONDS, self.interval)

    def stop(self) -> None:
        """Stop renewing; give back every lease still held (a warm shutdown ends the
        running tasks first, so these are runs that will not happen here)."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)
        with self._lock:
            held = list(self._held)
        for task_id in held:
            self.end(task_id, force=True)


def alive(request: Callable[[], Any]) -> bool:
    """Whether the worker still has the request (reserved or running): by the request
    itself, not its id, which another copy of the task shares."""
    found = request()
    if found is None:
        return False
    return found in worker_state.reserved_requests or found in worker_state.active_requests


def renewal_for(app: Any, worker: str = "") -> RenewalService:
    """The app's ``RenewalService`` in this process (a pool child gets its own)."""
    renewal: RenewalService | None = app.__dict__.get(ATTRIBUTE)
    if renewal is None or renewal.pid != os.getpid():
        renewal = RenewalService(app, worker)
        setattr(app, ATTRIBUTE, renewal)
    return renewal
