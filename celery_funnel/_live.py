"""A worker's live thread: it keeps the worker's copy of the overrides fresh and writes the
numbers the dashboard charts, in one round trip about twice a second, never on the task
path (a consumer bootstep thread in the worker's main process, like the releaser).

Each pass, one pipeline: reads the overrides hash and the parked counts; adds the
admitted/refused decisions counted in memory since the last pass to the per-minute
series (``<prefix>{~live}#series:<minute>``: field ``<funnel>|<second>|a`` or ``|r``,
expiring after an hour), and records how many tasks this worker holds per funnel
(``<prefix>{~live}#workers``: node -> JSON). When a funnel stops being paused (resumed,
unset, or its pause expired), its parked tasks are made due at once; when its rate or
capacity changed, its GCRA funnels are rebased first (``control.rebase``). Either way,
the tasks this worker holds for it decide again at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import signals
from ._gate import Charge, State, Step
from ._keys import live_key, parked_keys
from ._loop import Loop, LoopStep
from ._overrides import Change, Override, OverrideTable, changes

__all__ = ["Live", "LiveStep", "LiveThread", "live_for", "series_key"]

logger = logging.getLogger("celery_funnel")

ATTRIBUTE = "_celery_funnel_live"
REFRESH_SECONDS = 0.5  # overrides apply within this (plus a decision) on every worker
SERIES_KEEP_SECONDS = 3600.0 + 120.0  # an hour of per-second counts, and a margin
ERROR_PAUSE_SECONDS = 2.0
PAUSED_PARK_SECONDS = 60.0  # a paused funnel's task is parked this long at most
PAUSED_HOLD_SECONDS = 0.5  # with parking off, held this long between two looks


def series_key(prefix: str, minute: int) -> str:
    """The hash of the counts of minute ``minute`` (epoch seconds // 60)."""
    return live_key(prefix, f"series:{minute}")


class Live:
    """What live operation keeps for one app in one worker: the ``overrides`` table the
    gate decides with, and the decisions counted since the live thread's last pass."""

    def __init__(self) -> None:
        self.overrides = OverrideTable()
        self._counts: Counter[tuple[str, int, str]] = Counter()
        self._lock = threading.Lock()

    def count(self, labels: Iterable[str], admitted: bool) -> None:
        """One decision over the funnels ``labels``: admitted, or refused (deferred,
        paused or failed)."""
        second, kind = int(time.time()), "a" if admitted else "r"
        with self._lock:
            for label in labels:
                self._counts[(label, second, kind)] += 1

    def paused_step(self, charges: Sequence[Charge], state: State, *, parked: bool) -> Step | None:
        """The wait of a task of a paused funnel (None: none of ``charges`` is paused):
        parked when parking is on (a resume releases it at once), else held in the worker
        and looked at again soon (the table is local: no Redis call)."""
        if self.overrides.paused(charges) is None:
            return None
        delay = PAUSED_PARK_SECONDS if parked else PAUSED_HOLD_SECONDS
        return Step(run=False, delay=delay, state=state._replace(deferrals=state.deferrals + 1))

    def take(self) -> Counter[tuple[str, int, str]]:
        """The counts so far, forgotten here (the live thread writes them)."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return counts

    def give_back(self, counts: Counter[tuple[str, int, str]]) -> None:
        """Counts a failed pass could not write: written with the next one."""
        with self._lock:
            self._counts.update(counts)


def live_for(app: Any) -> Live:
    """The app's ``Live`` in this process, created on first call."""
    live: Live | None = app.__dict__.get(ATTRIBUTE)
    if live is None:
        live = Live()
        setattr(app, ATTRIBUTE, live)
    return live


class LiveThread(Loop):
    """Runs ``tick`` every ``REFRESH_SECONDS`` until ``stop()``. ``waiting()``: how many
    tasks this worker holds, per funnel label; ``changed(changes)``: the overrides in
    force changed (``_overrides.Change`` by funnel name; set, ended, expired)."""

    name = "celery-funnel-live"
    error_pause = ERROR_PAUSE_SECONDS

    def __init__(
        self,
        client: Any,
        prefix: str,
        live: Live,
        node: str,
        waiting: Callable[[], dict[str, int]],
        changed: Callable[[dict[str, Change]], Any],
    ) -> None:
        super().__init__()
        self.client, self.prefix, self.live, self.node = client, prefix, live, node
        self.waiting, self.changed = waiting, changed
        self._in_force: dict[str, Override] = {}

    def failed(self, error: Exception) -> None:
        # Redis down: the table keeps its last content; the gates report the outage
        logger.info("celery-funnel: live refresh failed: %s", error)

    def tick(self) -> float:
        """One pass: one pipeline (round trip), then the table and what changed; the
        pause before the next (seconds)."""
        counts = self.live.take()
        try:
            overrides, parked = self._exchange(counts)
        except Exception:
            self.live.give_back(counts)
            raise
        table = self.live.overrides
        table.load(overrides)
        in_force = table.all()
        changed = changes(self._in_force, in_force)
        if changed:
            self.changed(changed)
        self._in_force = in_force  # after: a failed pass takes the changes up again
        parked_counts = {
            (k.decode() if isinstance(k, bytes) else k): int(v) for k, v in parked.items()
        }
        signals.live_refreshed.send(sender=self.node, overrides=in_force, parked=parked_counts)
        return REFRESH_SECONDS

    def _exchange(self, counts: Counter[tuple[str, int, str]]) -> tuple[Any, Any]:
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(live_key(self.prefix, "overrides"))
        pipe.hgetall(parked_keys(self.prefix)[7])
        minutes = set()
        for (label, second, kind), n in counts.items():
            key = series_key(self.prefix, second // 60)
            pipe.hincrby(key, f"{label}|{second}|{kind}", n)
            minutes.add(key)
        for key in minutes:
            pipe.expire(key, int(SERIES_KEEP_SECONDS))
        state = {"at": time.time(), "waiting": self.waiting()}
        pipe.hset(live_key(self.prefix, "workers"), self.node, json.dumps(state))
        replies = pipe.execute()
        return replies[0], replies[1]


class LiveStep(LoopStep):
    """Consumer bootstep: runs a ``LiveThread`` while the consumer runs (funnels kept
    in Redis)."""

    label = "celery-funnel live"

    def make(self, consumer: Any) -> LiveThread | None:
        from . import control  # noqa: PLC0415 - control imports the task layer
        from ._runtime import runtime_for  # noqa: PLC0415
        from .worker import WorkerGate  # noqa: PLC0415

        runtime, app = runtime_for(consumer.app), consumer.app
        if not runtime.settings.redis_url:
            return None

        def gate() -> WorkerGate | None:
            found = consumer.on_task_request
            return found if isinstance(found, WorkerGate) else None

        def waiting() -> dict[str, int]:
            found = gate()
            return {} if found is None else found.waiting()

        def changed(found: dict[str, Change]) -> None:
            for name, change in sorted(found.items()):
                if change.limit:  # the old limit's bookings go; parked tasks released
                    control.rebase(app, name, change.after)
                elif change.unpaused:
                    control.release_parked(app, name)
            held = gate()
            if held is not None:  # every waiting task of those funnels decides again
                held.held.wake(set(found))

        return LiveThread(
            runtime.funnel.client, runtime.settings.key_prefix, live_for(app),  # type: ignore[attr-defined]
            getattr(consumer, "hostname", "") or "worker", waiting, changed,
        )  # fmt: skip
