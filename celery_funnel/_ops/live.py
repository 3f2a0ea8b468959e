"""A worker's live thread: it keeps the worker's copy of the overrides (``_shared.live``)
fresh and writes the numbers the dashboard charts, in one round trip about twice a
second, never on the task path (a consumer bootstep thread in the worker's main
process, like the releaser)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from .. import signals
from .._celery.loop import Loop, LoopStep, log_failure
from .._celery.worker import ReleaserStep
from .._config.runtime import runtime_for
from .._gate.gate import WorkerGate
from .._limiter.keys import live_key, parked_keys
from .._shared.adaptive import adaptive_key
from .._shared.live import (
    PAUSED_REFRESH_SECONDS,
    REFRESH_SECONDS,
    SERIES_KEEP_SECONDS,
    Live,
    live_for,
    series_key,
)
from .._shared.overrides import Change, Override, changes
from . import control
from .queues import QueueCounts

__all__ = ["LiveStep", "LiveThread", "live_workers"]


ERROR_PAUSE_SECONDS = 2.0


def live_workers(client: Any, prefix: str, fresh: float) -> dict[str, dict[str, Any]]:
    """The workers whose live thread wrote within the last ``fresh`` seconds (their
    clocks read against this one's): node name -> what it wrote (``at``, ``waiting``:
    the tasks it holds, by funnel label)."""
    now, found = time.time(), {}
    for raw_node, raw in client.hgetall(live_key(prefix, "workers")).items():
        state = json.loads(raw)
        if now - float(state.get("at", 0)) <= fresh:
            node = raw_node.decode() if isinstance(raw_node, bytes) else str(raw_node)
            found[node] = state
    return found


class LiveThread(Loop):
    """Runs ``tick`` every ``REFRESH_SECONDS`` (``PAUSED_REFRESH_SECONDS`` while a funnel
    is paused, or a resume waits to be acted on) until ``stop()``. ``waiting()``: how many
    tasks this worker holds, per funnel label; ``queues()``: (queue, how) -> tasks waiting
    on a funnel (``_ops.queues``; read only when a receiver of ``live_refreshed`` asks);
    ``changed(changes)``: the overrides in force changed (``_shared.overrides.Change`` by
    funnel name; set, ended, expired)."""

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
        queues: Callable[[], dict[tuple[str, str], int]] = dict,
        resumed: Callable[[dict[str, Change]], Any] = lambda found: None,
    ) -> None:
        super().__init__()
        self.client, self.prefix, self.live, self.node = client, prefix, live, node
        self.waiting, self.changed, self.queues = waiting, changed, queues
        self.resumed = resumed
        self._in_force: dict[str, Override] = {}
        self._resumed: dict[str, Change] = {}  # seen resumed on the last pass

    def failed(self, error: Exception) -> None:
        # Redis down: the table keeps its last content; the gates report the outage
        log_failure("live refresh", error)

    def tick(self) -> float:
        """One pass: one pipeline (round trip), then the table and what changed; the
        pause before the next (seconds)."""
        counts = self.live.take()
        try:
            overrides, adaptive, parked = self._exchange(counts)
        except Exception:
            self.live.keep(counts)
            raise
        table = self.live.overrides
        table.load(overrides)
        self.live.adaptive.load(adaptive)
        in_force = table.all()
        changed = changes(self._in_force, in_force)
        if self._resumed:  # one pass later: every worker's table has the resume by now
            self.resumed(self._resumed)
        self._resumed = {n: c for n, c in changed.items() if c.unpaused and not c.limit}
        if changed:
            self.changed(changed)
        self._in_force = in_force  # after: a failed pass takes the changes up again
        parked_counts = {
            (k.decode() if isinstance(k, bytes) else k): int(v) for k, v in parked.items()
        }
        signals.live_refreshed.send(
            sender=self.node, overrides=in_force, parked=parked_counts, queues=self.queues
        )
        if any(o.paused for o in in_force.values()) or self._resumed:
            return PAUSED_REFRESH_SECONDS
        return REFRESH_SECONDS

    def _exchange(self, counts: Counter[tuple[str, int, str]]) -> tuple[Any, Any, Any]:
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(live_key(self.prefix, "overrides"))
        pipe.hgetall(adaptive_key(self.prefix))
        pipe.hgetall(parked_keys(self.prefix).counts)
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
        return replies[0], replies[1], replies[2]


class LiveStep(LoopStep):
    """Consumer bootstep: runs a ``LiveThread`` while the consumer runs (funnels kept
    in Redis)."""

    label = "celery-funnel live"

    def make(self, consumer: Any) -> LiveThread | None:
        runtime, app = runtime_for(consumer.app), consumer.app
        if not runtime.settings.redis_url:
            return None

        def gate() -> WorkerGate | None:
            found = consumer.on_task_request
            return found if isinstance(found, WorkerGate) else None

        def waiting() -> dict[str, int]:
            found = gate()
            return {} if found is None else found.waiting()

        def wake_releaser() -> None:
            for step in getattr(consumer.blueprint, "order", None) or ():
                if isinstance(step, ReleaserStep) and step.loop is not None:
                    step.loop.wake()

        def changed(found: dict[str, Change]) -> None:
            for name, change in sorted(found.items()):
                if change.limit:  # the old limit's bookings go; parked tasks released
                    control.rebase(app, name, change.after)
            held = gate()
            if held is not None:  # every waiting task of those funnels decides again
                held.held.wake(set(found))

        def resumed(found: dict[str, Change]) -> None:
            # a pass after the resume was seen, so every worker's table has it (a task
            # released to a worker still paused would be parked again for a minute).
            # The funnel restarts at its rate from now: bookings made before the pause
            # would leave the slots of the tasks it parked empty (seconds of no start)
            for name, change in sorted(found.items()):
                control.rebase(app, name, change.after)
            wake_releaser()  # due at once: released now, not at the releaser's next pass
            held = gate()
            if held is not None:  # their bookings were dropped: decide again now
                held.held.wake(set(found))

        client, prefix = runtime.funnel.client, runtime.settings.key_prefix
        return LiveThread(
            client, prefix, live_for(app), getattr(consumer, "hostname", "") or "worker",
            waiting, changed, QueueCounts(consumer, client, prefix).counts, resumed,
        )  # fmt: skip
