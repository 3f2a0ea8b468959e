"""The worker gate's side of parked tasks (``_park``): when a deferred task is parked
instead of held or published again, and which released copy of a parked task runs.

A wait longer than ``funnel_park_after`` (at most the countdown cap) is parked in the
funnels' Redis, whatever the broker: the message leaves the broker and the worker's
memory, and costs one publish when it is released. Shorter waits are held in the worker
or published with a countdown, which is cheaper for a short wait. Outage back-offs are
never parked (the Redis that would keep them is the one failing), nor waits that run
past the task's ``expires`` (the task ends expired where it is).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

from .._config.runtime import Runtime
from .._limiter.errors import BackendError
from .._stores.fair import FairStore
from .._stores.park import ParkStore
from .charging import Charge, FairAdmit
from .fair import SAFETY_SECONDS, Queues, admit
from .publish import park
from .state import State

__all__ = ["Parking"]

logger = logging.getLogger("celery_funnel")


class Parking:
    """Parking for one worker gate: ``store`` is None when parking is off."""

    def __init__(self, runtime: Runtime) -> None:
        settings = runtime.settings
        self.store: ParkStore | None = None
        self.fair: FairStore | None = None
        self.queues: Queues | None = None
        if settings.redis_url:
            client = runtime.funnel.client  # type: ignore[attr-defined]
            self.store = ParkStore(client, settings.key_prefix)
            self.fair = FairStore(client, settings.key_prefix)
            self.queues = Queues(self.fair)
        self.persistence = runtime.persistence if self.store is not None else None
        self.after = min(settings.park_after, runtime.countdowns.cap)
        self._failing = False

    @property
    def on(self) -> bool:
        """Whether waits are parked now: never on a Redis that can forget them
        (``_persistence``)."""
        return self.persistence is not None and self.persistence.keeps()

    def start(self) -> None:
        """At worker start: read the funnels' Redis, say why parking is off.

        Raises:
            ConfigurationError: ``funnel_park=True`` on a Redis without AOF.
        """
        if self.persistence is not None:
            self.persistence.start()

    def wants(self, delay: float, until_expiry: float, *, outage: bool) -> bool:
        """Whether a wait of ``delay`` seconds is parked."""
        return self.on and not outage and self.after < delay < until_expiry

    def fair_step(self, task_id: str) -> FairAdmit | None:
        """The gate's step on fair-share charges of task ``task_id`` (None with parking
        off: fair funnels are then ordinary ones)."""
        if not self.on or self.fair is None:
            return None
        return partial(admit, self.fair, task_id)

    def park(
        self,
        request: Any,
        state: Mapping[str, Any],
        delay: float,
        label: str,
        fair: tuple[Charge, bool] | None = None,
        rank: int = 0,
    ) -> bool:
        """Park ``request`` (a Celery worker Request) for ``delay`` seconds, or with
        ``fair`` (its fair charge, in front or not) in its tenant's waiting queue at its
        priority ``rank``; False
        when it is a stale copy of a task released and run already (drop it).

        Raises:
            BackendError: when Redis fails (keep the request).
        """
        assert self.store is not None
        assert self.queues is not None
        fresh = park(
            self.store, request.task, request._context, request.args, request.kwargs,
            wait=delay if fair is None else SAFETY_SECONDS, state=state, label=label,
            content_type=request.content_type, content_encoding=request.content_encoding,
        )  # fmt: skip
        if fresh and fair is not None:
            self.queues.queue(fair[0], request.id, rank, fair[1])
        return fresh

    def accept(self, request: Any, state: State) -> bool:
        """Whether to run this released copy of a parked task: False when another copy
        of the same release ran (a releaser died between publishing and recording it).
        When Redis cannot say, the copy runs (a duplicate needs that crash as well)."""
        if not state.release or self.store is None:
            return True
        try:
            fresh = self.store.accept(request.id, state.release)
        except BackendError as error:
            if not self._failing:
                logger.info("celery-funnel: cannot check released copies: %s", error)
            self._failing = True
            return True
        self._failing = False
        if not fresh:
            logger.info(
                "celery-funnel: task %s[%s]: another copy of its release ran; this one"
                " is dropped", request.name, request.id,
            )  # fmt: skip
        return fresh
