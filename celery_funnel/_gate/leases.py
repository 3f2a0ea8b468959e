"""The leases of one app in one process: the ones this worker's gate took, renewed by
one thread in one call per interval, and given back when their runs end.

Where a run's end is seen: ``task_postrun`` in the process that ran the body (a pool
child under prefork: it reads the lease from the run's header), for success, failure,
retry, ``Reject``, ``Ignore`` and the soft time limit; ``task_failure`` and
``task_revoked`` in the worker's main process for a hard time limit, a pool process
lost, a revoke with terminate, or a revoke before the run started. Each tick of the
renewer also gives back the leases of requests the worker no longer knows (an ending
no signal reported), and a warm shutdown gives back whatever is still held. A lease
given back twice is given back once (task id and token). Slots freed go to the
oldest parked waiters, which the freeing process publishes at once (``hand_on``).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from celery import signals
from celery.worker import state as worker_state

from .._config.runtime import runtime_for
from .._limiter.errors import BackendError
from .._limiter.keys import hash_tag
from .._stores.leases import Handed, Lease, LeaseStore, SlotFunnel, header_of
from .._stores.park import ParkStore, Release
from .publish import publish
from .state import HEADER

__all__ = ["Leases", "alive", "connect", "leases_for"]

logger = logging.getLogger("celery_funnel")
ATTRIBUTE = "_celery_funnel_leases"
ERROR_PAUSE_SECONDS = 1.0


class Leases:
    """The concurrency slots of ``app`` in this process (``worker``: its node name)."""

    def __init__(self, app: Any, worker: str = "") -> None:
        runtime = runtime_for(app)
        settings = runtime.settings
        client = runtime.funnel.client  # type: ignore[attr-defined]
        self.app, self.worker, self.pid = app, worker, os.getpid()
        self.store = LeaseStore(client, settings.key_prefix, settings.lease_ttl)
        self.parked = ParkStore(client, settings.key_prefix)
        self.park_lease = settings.park_lease
        self.interval = settings.lease_ttl / 3
        # task id -> the lease this process's gate took, and its request (weakly)
        self._held: dict[str, tuple[Lease, Callable[[], Any]]] = {}
        self._funnels: dict[str, SlotFunnel] = {}  # swept at each renewal
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, lease: Lease, request: Any) -> None:
        """Renew ``lease`` until the run of ``request`` (a worker Request) ends."""
        with self._lock:
            self._held[lease.task_id] = (lease, weakref.ref(request))
        self.know(lease.slot_funnels)

    def know(self, slot_funnels: Iterable[SlotFunnel]) -> None:
        """Sweep these funnels for leases that ran out, at each renewal."""
        with self._lock:
            for slot_funnel in slot_funnels:
                self._funnels[slot_funnel.key] = slot_funnel
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._run, name="celery-funnel-leases")
                self._thread.daemon = True
                self._thread.start()

    def end(self, task_id: str, lease: Lease | None = None, *, force: bool = False) -> None:
        """A run of ``task_id`` ended: give its slots back (``lease``: from its header;
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
            self.hand_on(self.store.release(lease.slot_funnels, task_id, lease.token)[1])
        except Exception as error:  # the lease then runs out: the slot returns later
            logger.warning(
                "celery-funnel: could not give back the slot of task %s: %r", task_id, error
            )

    def hand_on(self, handed: list[Handed]) -> None:
        """Publish the parked waiters ``handed`` a slot, each saying where (a waiter
        received by a worker that counts other funnels, ``"scope": "worker"``, gives
        those slots up); a waiter no longer parked gives its slot to the next one.

        Raises:
            BackendError: when Redis fails (a claimed waiter is published by a releaser
                once its claim runs out; a slot handed on runs out after the TTL).
        """
        while handed:
            where: dict[str, list[SlotFunnel]] = {}
            for slot_funnel, task_id in handed:
                where.setdefault(task_id, []).append(slot_funnel)
            missing, releases = self.store.wake(list(where), self.park_lease)
            for release in releases:
                publish(self.app, _promised(release, where[release.task_id]))
                self.parked.done(release)
            handed = []
            for task_id in missing:
                handed += self.store.release(where[task_id], task_id, "")[1]

    def tick(self) -> None:
        """Renew every lease held, give back those of runs the worker forgot, sweep
        the known funnels, and publish the waiters handed a slot: one call (one per
        hash tag on a Redis Cluster)."""
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
                for slot_funnel in lease.slot_funnels:
                    pairs.setdefault(slot_funnel.key, []).append((lease.task_id, lease.token))
        for group in self._slots(funnels):
            renewal = self.store.renew(group, pairs)
            with self._lock:
                for _, task_id in renewal.gone:  # given back by the process that ran it
                    entry = self._held.get(task_id)
                    if entry is not None and entry[0].token == tokens.get(task_id):
                        del self._held[task_id]
                used = {s.key for lease, _ in self._held.values() for s in lease.slot_funnels}
                for key in renewal.empty:
                    if key not in used:
                        self._funnels.pop(key, None)
            self.hand_on(renewal.promoted)

    def _slots(self, funnels: list[SlotFunnel]) -> list[list[SlotFunnel]]:
        """The funnels in groups one script may touch: all at once on one Redis, one
        group per hash tag on a Redis Cluster."""
        if "Cluster" not in type(self.store.client).__name__:
            return [funnels] if funnels else []
        groups: dict[str | None, list[SlotFunnel]] = {}
        for slot_funnel in funnels:
            groups.setdefault(hash_tag(slot_funnel.key), []).append(slot_funnel)
        return list(groups.values())

    def _run(self) -> None:
        pause = self.interval
        while not self._stopped.wait(pause):
            try:
                self.tick()
                pause = self.interval
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


def _promised(release: Release, slot_funnels: Sequence[SlotFunnel]) -> Release:
    """``release`` with the funnels whose slot it was handed in its header."""
    headers = dict(release.message["headers"])
    headers[HEADER] = {**(headers.get(HEADER) or {}), "promised": header_of(slot_funnels)}
    return Release(release.task_id, release.token, {**release.message, "headers": headers})


def leases_for(app: Any, worker: str = "") -> Leases:
    """The app's ``Leases`` in this process (a pool child gets its own)."""
    leases: Leases | None = app.__dict__.get(ATTRIBUTE)
    if leases is None or leases.pid != os.getpid():
        leases = Leases(app, worker)
        setattr(app, ATTRIBUTE, leases)
    return leases


def _of(task: Any) -> Leases | None:
    """The task's app's ``Leases``, when the app uses concurrency limits here."""
    app = getattr(task, "app", None)
    if app is None or not runtime_for(app).installed or ATTRIBUTE not in app.__dict__:
        return None
    return leases_for(app)


def _lease_in(task: Any, task_id: str) -> Lease | None:
    request = getattr(task, "request", None)
    header = getattr(request, HEADER, None) or (getattr(request, "headers", None) or {}).get(HEADER)
    return Lease.from_header(task_id, header)


def _on_postrun(sender: Any = None, task_id: str = "", **_: Any) -> None:
    lease = _lease_in(sender, task_id)
    if lease is not None and runtime_for(sender.app).installed:
        leases_for(sender.app).end(task_id, lease)


def _on_failure(sender: Any = None, task_id: str = "", **_: Any) -> None:
    leases = _of(sender)
    if leases is not None:
        leases.end(task_id)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    leases = _of(sender)
    task_id = getattr(request, "id", None)
    if leases is not None and task_id:
        leases.end(task_id)


def connect() -> None:
    """Connect the receivers that give slots back (once per process)."""
    signals.task_postrun.connect(
        _on_postrun, dispatch_uid="celery_funnel.lease_postrun", weak=False
    )
    signals.task_failure.connect(
        _on_failure, dispatch_uid="celery_funnel.lease_failure", weak=False
    )
    signals.task_revoked.connect(
        _on_revoked, dispatch_uid="celery_funnel.lease_revoked", weak=False
    )
