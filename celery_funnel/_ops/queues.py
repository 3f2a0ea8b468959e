"""Per queue, the tasks waiting on a funnel (``celery_funnel_waiting{queue,how}``, an
autoscaling signal): read by a worker's live thread, in its main process.

- ``held`` and ``republished``: what this worker holds (``inspect funnel_waiting``'s
  rows); the queue is the routing key the message came by (Celery's default direct
  exchanges route a task to the queue of that name).
- ``parked``: the parked tasks in the funnels' Redis, the whole cluster's (every worker
  reports the same), by the routing key each entry's message was captured with; a
  waiter parked for a concurrency seat counts here too. Read at most every
  ``PARKED_SCAN_SECONDS``: the ids in one call, and the messages of ids not seen
  before, ``PARKED_SCAN_MAX`` at most per read (ids not read yet count under queue
  ``""`` until a later read learns them).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import Any

from celery.worker import state as worker_state
from redis.exceptions import RedisError

from .._celery.waiting import waiting
from .._limiter.keys import parked_keys

__all__ = ["PARKED_SCAN_MAX", "PARKED_SCAN_SECONDS", "QueueCounts", "queue_of"]

logger = logging.getLogger("celery_funnel")

PARKED_SCAN_SECONDS = 5.0
PARKED_SCAN_MAX = 20_000
PAGE = 500


def queue_of(request: Any) -> str:
    """The queue a request came from: its routing key ("" when not known)."""
    info = getattr(request, "delivery_info", None) or {}
    return str(info.get("routing_key") or "")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _snapshot(items: Any) -> list[Any]:
    """A copy of a set another thread changes (a few tries, else nothing)."""
    for _ in range(5):
        try:
            return list(items)
        except RuntimeError:  # changed size during iteration
            continue
    return []


class QueueCounts:
    """``counts()``: (queue, how) -> tasks waiting on a funnel, for ``consumer``'s worker
    and the parked tasks under ``prefix`` in ``client`` (redis-py)."""

    def __init__(self, consumer: Any, client: Any, prefix: str) -> None:
        self.consumer, self.client = consumer, client
        self.keys = parked_keys(prefix)
        self._queues: dict[str, str] = {}  # parked task id -> its queue
        self._parked: Counter[tuple[str, str]] = Counter()
        self._read_at = -PARKED_SCAN_SECONDS

    def counts(self) -> dict[tuple[str, str], int]:
        found = self.held()
        found.update(self.parked())
        return dict(found)

    def held(self) -> Counter[tuple[str, str]]:
        """This worker's held and republished tasks, by queue."""
        rows = waiting(self.consumer)
        if not rows:
            return Counter()
        requests = {r.id: r for r in _snapshot(worker_state.reserved_requests)}
        for scheduled in _snapshot(self.consumer.timer.schedule.queue):
            args = getattr(scheduled.entry, "args", None) or ()
            if args and getattr(args[0], "id", None) is not None:
                requests.setdefault(args[0].id, args[0])
        return Counter((queue_of(requests.get(row["id"])), str(row["how"])) for row in rows)

    def parked(self) -> Counter[tuple[str, str]]:
        """The parked tasks, by queue (the last read when it is recent or Redis fails)."""
        now = time.monotonic()
        if now - self._read_at < PARKED_SCAN_SECONDS:
            return self._parked
        self._read_at = now
        try:
            ids = [_text(i) for i in self.client.hkeys(self.keys.entries)]
            new = [i for i in ids if i not in self._queues][:PARKED_SCAN_MAX]
            for start in range(0, len(new), PAGE):
                page = new[start : start + PAGE]
                raws = self.client.hmget(self.keys.entries, page)
                for task_id, raw in zip(page, raws, strict=True):
                    if raw is not None:
                        self._queues[task_id] = _queue_of_entry(raw)
        except RedisError as exc:  # the gates report the outage; keep the last counts
            logger.debug("celery-funnel: parked tasks by queue not read: %s", exc)
            return self._parked
        self._queues = {i: self._queues[i] for i in ids if i in self._queues}
        self._parked = Counter((self._queues.get(i, ""), "parked") for i in ids)
        return self._parked


def _queue_of_entry(raw: str | bytes) -> str:
    """The routing key a parked entry's message is published with ("" if unreadable)."""
    try:
        message = json.loads(raw)
    except ValueError:
        return ""
    declared = message.get("declare") or [""]
    return str(message.get("routing_key") or declared[0] or "")
