"""The releaser: every worker publishes the parked tasks that are due (a consumer bootstep
running one thread in the worker's main process; no leader, nothing else to deploy).

Each pass claims the entries due within ``lead`` seconds, with a lease, and publishes
each to its original exchange and routing key with the release's token in its
``celery_funnel`` header. A revoked task is dropped instead, in the first pass after the
worker sees its revoke (``_celery.revoked``), whatever its release time. The entry stays
until a worker accepts a copy of its release (``_stores.copies``): a copy lost on its
way (its releaser died before publishing, or the worker that took it from the queue died
before the broker recorded the delivery) is published again once the lease runs out, and
the worker gate runs only the first copy accepted. Each pass first hands the free slots
of fair-share funnels to their waiting tasks (``_celery.dispatch.Dispatcher``, handed to
it where a task has a fair funnel), which makes those entries due. The releaser is
composed by ``_celery.services`` and run by ``_celery.worker.ReleaserStep``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker import state as worker_state

from .._config.options import limits_of
from .._config.runtime import runtime_for
from .._stores.copies import KEEP_SECONDS
from .._stores.park import ParkStore, Release
from . import backlog, unique
from .dispatch import Dispatcher
from .loop import Loop, log_failure
from .release import publish
from .revoked import NewlyRevoked

__all__ = ["Releaser", "announce_revoked", "has_fair_funnel", "park_store"]

logger = logging.getLogger("celery_funnel")

LEAD_SECONDS = 1.0  # released this early: the gate holds an early arrival to its slot
LEASE_SECONDS = 30.0  # funnel_park_lease: a releaser dying mid-release is replaced then
BATCH = 100  # entries claimed per pass
IDLE_SECONDS = 1.0  # the longest pause between two passes
ERROR_PAUSE_SECONDS = 2.0


class Releaser(Loop):
    """Releases the app's due parked tasks from ``store`` until ``stop()``; each pass
    first runs ``dispatcher`` (None: the app has no fair funnel)."""

    name = "celery-funnel-releaser"
    error_pause = ERROR_PAUSE_SECONDS

    def __init__(
        self,
        app: Any,
        store: ParkStore,
        lease: float = LEASE_SECONDS,
        lead: float = LEAD_SECONDS,
        revoked: Callable[[str], None] | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        super().__init__()
        self.app, self.store, self.lease, self.lead = app, store, lease, lead
        self.revoked = revoked  # sends the task-revoked event of a dropped task
        self.dispatcher = dispatcher
        self.newly_revoked = NewlyRevoked()

    def failed(self, error: Exception) -> None:
        log_failure("releasing parked tasks", error)

    def recovered(self) -> None:
        logger.info("celery-funnel: releasing parked tasks works again")

    def _drop(self, release: Release) -> None:
        """A revoked task: never published; its result says REVOKED and a
        ``task-revoked`` event is sent, as Celery ends a revoked task."""
        self.store.accept(release.task_id, release.token, drop=True)
        self.app.backend.mark_as_revoked(release.task_id, "revoked while parked")
        if self.revoked is not None:
            self.revoked(release.task_id)
        logger.info("celery-funnel: parked task %s was revoked: dropped", release.task_id)
        backlog.left_parked(self.app, release.task_id, release.message)
        call = backlog.parked_call(self.app, release.message)
        if call is not None:  # a unique task frees its key
            unique.free(call[0], release.task_id, call[1], call[2])

    def tick(self) -> float:
        """One pass; how long to pause before the next (seconds)."""
        revoked = self.newly_revoked.take()
        if revoked:  # due now, dropped below; should this fail, dropped at release time
            self.store.make_due(revoked)
        fair = self.dispatcher.tick() if self.dispatcher is not None else None
        pause = self._release()
        return pause if fair is None else min(pause, fair)

    def _release(self) -> float:
        following, now, releases = self.store.claim(self.lead, self.lease, BATCH, KEEP_SECONDS)
        for release in releases:
            if release.task_id in worker_state.revoked:
                self._drop(release)
                continue
            publish(self.app, release)
        if len(releases) == BATCH:
            return 0.0
        if following < 0:
            return IDLE_SECONDS
        return min(max(following - self.lead - now, 0.01), IDLE_SECONDS)


def has_fair_funnel(app: Any) -> bool:
    """Whether a task of ``app`` has a fair-share funnel (``funnel_fair_by``)."""
    for task in list(app.tasks.values()):
        try:
            if any(limit.fair_by is not None for limit in limits_of(task)):
                return True
        except Exception:  # a bad option stops the worker elsewhere, named
            continue
    return False


def park_store(app: Any) -> ParkStore | None:
    """The app's parked tasks (None when parking is off)."""
    runtime = runtime_for(app)
    if not runtime.settings.park or not runtime.settings.redis_url:
        return None
    return ParkStore(runtime.funnel.client, runtime.settings.key_prefix)


def announce_revoked(consumer: Any, task_id: str) -> None:
    """Send ``task-revoked`` for ``task_id`` from ``consumer``'s worker, when it sends
    task events (``-E``), with the fields Celery's own carries. From the releaser's
    thread: on a dispatcher of its own (the consumer's belongs to its event loop)."""
    dispatcher = consumer.event_dispatcher
    groups = getattr(dispatcher, "groups", None)
    if dispatcher is None or not dispatcher.enabled or (groups and "task" not in groups):
        return
    with consumer.app.events.default_dispatcher(hostname=consumer.hostname) as own:
        own.send("task-revoked", uuid=task_id, terminated=False, signum=None, expired=False)
