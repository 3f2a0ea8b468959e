"""The worker gate's side of parked tasks (``_stores.park``): when a deferred task is
parked instead of held or published again (which copy of it runs then is ``copies``').

Which waits are parked is the wait policy's (``_config.waiting``): a parked task's
message leaves the broker and the worker's memory, and costs one publish when it is
released, whatever the broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from .._config.runtime import Runtime
from .._limiter.errors import BackendError
from .._shared.charges import Charge
from .._shared.charges_decide import FairAdmit
from .._shared.fair import SAFETY_SECONDS, Queues, admit
from .._shared.publish import park
from .._stores.fair import FairStore
from .._stores.park import ParkStore

__all__ = ["QUEUE_GRACE_SECONDS", "Parking"]

logger = logging.getLogger("celery_funnel")

# a task parked to wait in a queue is parked, then queued, in two calls (two hash
# tags): it is due this long after its park until its queueing is confirmed
QUEUE_GRACE_SECONDS = 10.0


class Parking:
    """Parking for one worker gate: ``store`` is None when parking is off. ``backups``:
    a copy published again is backed up in the parked store (``back_up``), where its
    releasers run: the broker's Redis transport may lose a message on its way."""

    def __init__(self, runtime: Runtime, backups: bool = False) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.store: ParkStore | None = None
        self.fair: FairStore | None = None
        self.queues: Queues | None = None
        if settings.redis_url:
            client = runtime.funnel.client
            self.store = ParkStore(client, settings.key_prefix)
            self.fair = FairStore(client, settings.key_prefix)
            self.queues = Queues(self.fair)
        self.persistence = runtime.persistence if self.store is not None else None
        # releasers run wherever funnel_park is not False (_celery.releaser.park_store)
        self.backs_up = backups and self.store is not None and settings.park is not False

    @property
    def on(self) -> bool:
        """Whether waits are parked now: never on a Redis that can forget them
        (``_stores.persistence``)."""
        return self.persistence is not None and self.persistence.keeps()

    def start(self) -> None:
        """At worker start: read the funnels' Redis, say why parking is off.

        Raises:
            ConfigurationError: ``funnel_park=True`` on a Redis without AOF.
        """
        if self.persistence is not None:
            self.persistence.start()

    def fair_admit(self, task_id: str) -> FairAdmit | None:
        """How the gate admits fair-share charges of task ``task_id`` (None with parking
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
        queue: Callable[[], None] | None = None,
    ) -> bool:
        """Park ``request`` (a Celery worker Request) for ``delay`` seconds; with ``fair``
        (its fair charge, in front or not) in its tenant's waiting queue at its priority
        ``rank`` (until a dispatcher books it, ``SAFETY_SECONDS`` at most); with
        ``queue``, the call that queues it elsewhere (for a seat). False when it is a
        stale copy of a task released and run already (drop it).

        Raises:
            BackendError: when Redis fails parking it (keep the request).
        """
        assert self.store is not None
        assert self.queues is not None
        if fair is not None:
            delay = SAFETY_SECONDS
            queue = partial(self.queues.queue, fair[0], request.id, rank, fair[1])
        release = self._park(request, state, label, delay if queue is None else QUEUE_GRACE_SECONDS)
        if release is None:
            return False
        if queue is not None:
            self._queue(request, release, delay, queue)
        return True

    def back_up(
        self, request: Any, state: Mapping[str, Any], label: str, token: str, countdown: float
    ) -> bool:
        """Back up copy ``token`` of ``request``, about to be published with ``countdown``
        seconds (``state``: the copy's, without the countdown): its parked entry, claimed
        for the copy until the countdown and ``funnel_park_lease`` are over, is
        published again by a releaser should no worker have accepted the copy by then,
        and forgotten when one does. It is what records the copy (``copies``): False
        when the copy held is stale (drop it, publish nothing).

        Raises:
            BackendError: when the funnels' Redis fails (publish nothing).
        """
        self.runtime.outage.check()  # no call waits on a Redis known to fail
        lease = countdown + self.runtime.settings.park_lease
        return self._park(request, state, label, 0.0, (token, lease)) is not None

    def _park(
        self, request: Any, state: Mapping[str, Any], label: str, wait: float,
        backup: tuple[str, float] | None = None,
    ) -> int | None:  # fmt: skip
        """``publish.park`` of worker Request ``request``: its release time, or None."""
        assert self.store is not None
        return park(
            self.store, request.task, request._context, request.args, request.kwargs,
            wait=wait, state=state, label=label, content_type=request.content_type,
            content_encoding=request.content_encoding, backup=backup,
        )  # fmt: skip

    def _queue(self, request: Any, release: int, delay: float, queue: Callable[[], None]) -> None:
        """Queue the parked ``request`` (``queue``), then move its release (``release``,
        as parked) out to ``delay``. Until then it is due ``QUEUE_GRACE_SECONDS`` after
        its park: a worker killed, or a Redis failing, between the park and the queue
        leaves it released soon to be decided again, not parked for ``delay``."""
        assert self.store is not None
        try:
            queue()
            self.store.postpone(request.id, release, delay)
        except BackendError as error:  # parked: released within the grace
            logger.warning(
                "celery-funnel: task %s[%s] parked to wait in a queue, but its queueing is"
                " not confirmed (%r): it is decided again within %.0f s", request.name,
                request.id, error,
                QUEUE_GRACE_SECONDS,
            )  # fmt: skip
