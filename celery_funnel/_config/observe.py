"""What the gates report about each decision: the package's signals, Celery events
(``funnel-deferred``, for Flower and other event consumers) and log lines with the same
fields in ``extra`` (``record.celery_funnel``), for structured logging.

The deferral event is not a ``task-*`` event on purpose: Celery's
``celery.events.state.State`` (what Flower keeps) turns any ``task-<x>`` event into a
task state ``<X>`` ranked above STARTED and REVOKED, so a deferred task would never
show STARTED, and one revoked while it waits would never show REVOKED. State ignores an
event of another group: the task's states stay Celery's own (RECEIVED while it waits)."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from .. import signals

__all__ = ["DROPPED", "EVENT", "Observer"]

logger = logging.getLogger("celery_funnel")

EVENT = "funnel-deferred"
# how a deferred task waits: in the worker, parked in the funnels' Redis, in the broker
HOW = ("held", "parked", "republished")
# a unique task dropped: its key held by another task (funnel_unique); not a "task-*"
# event, which Celery's State would read as a state of the task
DROPPED = "funnel-dropped"

SendEvent = Callable[..., Any]


class Observer:
    """Reports one app's decisions. ``events``: task events are on in this worker
    (``worker_send_task_events``, or ``celery worker -E``, seen at ``celeryd_init``).
    ``log_waits_over``: a longer wait is also logged at INFO (``funnel_log_waits_over``)."""

    def __init__(self, app: Any, log_waits_over: float = 5.0) -> None:
        self.app = app
        self.events = bool(app.conf.worker_send_task_events)
        self.log_waits_over = log_waits_over

    def admitted(self, name: str, task_id: str, funnel: str, *, dry_run: bool = False) -> None:
        """A task passed ``funnel``."""
        if signals.task_admitted.receivers:  # Celery's send costs ~10 us even for none
            signals.task_admitted.send(sender=name, task_id=task_id, funnel=funnel, dry_run=dry_run)

    def deferred(
        self,
        name: str,
        task_id: str,
        funnel: str,
        delay: float,
        *,
        send_event: SendEvent | None = None,
        **fields: Any,
    ) -> None:
        """A task waits ``delay`` seconds; ``fields``: ``deferrals``, ``booked``,
        ``outage``, ``requeued``, ``dry_run``, ``how`` (one of ``HOW``; by default
        from ``requeued``). ``send_event(type, **fields)`` sends the Celery event
        (pass it only when events are on) unless it is a dry run."""
        info: dict[str, Any] = {
            "deferrals": 1,
            "booked": False,
            "outage": False,
            "requeued": False,
            "dry_run": False,
            **fields,
        }
        info.setdefault("how", "republished" if info["requeued"] else "held")
        signals.task_deferred.send(sender=name, task_id=task_id, funnel=funnel, delay=delay, **info)
        dry_run = info["dry_run"]
        record: dict[str, Any] = {"event": "deferred", "task": name, "task_id": task_id}
        record["funnel"] = funnel
        record.update(delay=round(delay, 6), **info)
        logger.log(
            logging.INFO if dry_run else logging.DEBUG,
            "celery-funnel: %s %.1f s by funnel %s (slot %s): %s[%s] deferrals=%s%s",
            "would defer (dry run)" if dry_run else "deferred",
            delay, funnel, _local_time(time.time() + delay), name, task_id,
            info["deferrals"], " requeued" if info["requeued"] else "",
            extra={"celery_funnel": record},
        )  # fmt: skip
        if send_event is not None and not dry_run:
            send_event(EVENT, name=name, funnel=funnel, delay=delay, **info)
        if delay > self.log_waits_over and not dry_run:  # why nothing runs, at INFO
            logger.info(
                "celery-funnel: task %s[%s] waits %.1f s for %s (%s)", name, task_id, delay,
                funnel, info["how"], extra={"celery_funnel": {**record, "event": "waits"}},
            )  # fmt: skip

    def collapsed(self, name: str, task_id: str, funnel: str, kind: str) -> None:
        """A send of task ``name`` published nothing of its own: it joined task
        ``task_id`` (``kind``: ``"unique"`` or ``"debounce"``)."""
        if signals.task_collapsed.receivers:
            signals.task_collapsed.send(sender=name, task_id=task_id, funnel=funnel, kind=kind)
        logger.debug(
            "celery-funnel: a send of %s joined task %s (%s, key %s)", name, task_id, kind, funnel,
            extra={"celery_funnel": {
                "event": "collapsed", "task": name, "task_id": task_id, "funnel": funnel,
                "kind": kind,
            }},
        )  # fmt: skip

    def dropped(
        self, name: str, task_id: str, funnel: str, holder: str, send_event: SendEvent | None
    ) -> None:
        """A worker dropped unique task ``task_id``: task ``holder`` holds its key.
        ``send_event(type, **fields)`` sends the Celery event (None: events are off)."""
        signals.task_dropped.send(sender=name, task_id=task_id, funnel=funnel, holder=holder)
        logger.info(
            "celery-funnel: dropped task %s[%s]: task %s holds its unique key %s (marked"
            " REVOKED, not run)", name, task_id, holder, funnel,
            extra={"celery_funnel": {
                "event": "dropped", "task": name, "task_id": task_id, "funnel": funnel,
                "holder": holder,
            }},
        )  # fmt: skip
        if send_event is not None:
            send_event(DROPPED, name=name, funnel=funnel, holder=holder)

    def quiet_ignored(self, task_id: str) -> None:
        """Keep Celery's "Task ... ignored" INFO line for ``task_id`` out of the log: the
        run ended with ``Ignore`` because it was deferred, which was logged already."""
        _IGNORED_FILTER.add(task_id)

    def refused(self, name: str, task_id: str, funnel: str, error: BaseException) -> None:
        """The funnel fails a task with ``error``."""
        signals.task_refused.send(sender=name, task_id=task_id, funnel=funnel, error=error)
        record = {"event": "refused", "task": name, "task_id": task_id, "funnel": funnel}
        logger.info(
            "celery-funnel: refused task=%s task_id=%s funnel=%s error=%s",
            name, task_id, funnel, type(error).__name__,
            extra={"celery_funnel": {**record, "error": str(error)}},
        )  # fmt: skip


def _local_time(at: float) -> str:
    """``at`` (seconds since the epoch) as local wall time, to the tenth of a second."""
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 10) % 10}"


class _IgnoredFilter(logging.Filter):
    """Drops the tracer's "Task ... ignored" record of runs ended by a deferral."""

    LIMIT = 10_000  # ids kept (a record is dropped once; unused ids age out)

    def __init__(self) -> None:
        super().__init__()
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._installed = False

    def add(self, task_id: str) -> None:
        with self._lock:
            if not self._installed:
                logging.getLogger("celery.app.trace").addFilter(self)
                self._installed = True
            self._ids[task_id] = None
            while len(self._ids) > self.LIMIT:
                self._ids.popitem(last=False)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, Mapping) or args.get("description") != "ignored":
            return True
        with self._lock:
            deferred = str(args.get("id")) in self._ids
            self._ids.pop(str(args.get("id")), None)
        return not deferred


_IGNORED_FILTER = _IgnoredFilter()
