"""The worker gate's side of a task's copies (``_stores.copies``): a copy checked on
arrival goes on only if it is the task's accepted copy, and a new copy is recorded
before it is published.

When the funnels' Redis cannot say (an outage), a copy that needs the check does not go
on unchecked: it waits, held, and is checked again (``CopyGuard.accept`` answers None),
whatever ``funnel_on_backend_error`` says, and is handed back to the broker at its
delivery's deadline (``delivery``).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections import deque
from typing import Any

from .._config.runtime import Runtime
from .._limiter.errors import BackendError
from .._stores.copies import Copies, CopiesBusyError
from .publish import origin
from .state import State

__all__ = ["CUT_SECONDS", "CopyGuard", "new_token"]

logger = logging.getLogger("celery_funnel")

# acks sent this long before a broker connection died may have died with it (AMQP acks
# are not confirmed): their runs are recorded; at most ACKS_KEPT acks are kept in mind
CUT_SECONDS = 300.0
ACKS_KEPT = 50_000


def new_token() -> str:
    """A token for a new copy of a task."""
    return uuid.uuid4().hex


class CopyGuard:
    """The copies' records of the gate's app (none without a funnels' Redis: every
    copy goes on, as before any copy was made). ``unconfirmed_acks``: the broker does
    not confirm acks (AMQP), so any ack sent lately may die with its connection."""

    def __init__(self, runtime: Runtime, unconfirmed_acks: bool = False) -> None:
        self.runtime, self.unconfirmed_acks = runtime, unconfirmed_acks
        self.acked: deque[tuple[float, str, str]] = deque(maxlen=ACKS_KEPT)
        # id(request) -> (task id, token, request): admitted, message not acked yet
        self.unacked: dict[int, tuple[str, str, Any]] = {}
        self.store: Copies | None = None
        if runtime.settings.redis_url:
            client = runtime.funnel.client
            self.store = Copies(client, runtime.settings.key_prefix)

    def accept(self, request: Any, state: State) -> BackendError | CopiesBusyError | bool:
        """Whether ``request`` (a Celery worker Request, carrying ``state``) goes on:
        True, False (a stale copy: drop it), the ``BackendError`` that kept the
        funnels' Redis from saying (the copy waits and is checked again), or
        ``CopiesBusyError``: another send of its task id goes first (it waits, and is
        checked again)."""
        if self.store is None:
            return True
        redelivered = bool((request.delivery_info or {}).get("redelivered"))
        try:
            self.runtime.outage.check()
            fresh = self.store.accept(
                request.id, state.release, origin(request._context), redelivered=redelivered
            )
        except BackendError as error:
            self.runtime.outage.failed(error, "defer")
            return error
        except CopiesBusyError as busy:
            self.runtime.outage.answered()
            return busy
        self.runtime.outage.answered()
        if not fresh:
            logger.info(
                "celery-funnel: task %s[%s]: another copy of it goes on (or it is parked);"
                " this one is dropped", request.name, request.id,
            )  # fmt: skip
        return fresh

    def move(self, request: Any, state: State, token: str) -> bool:
        """Record copy ``token`` of ``request``'s task before it is published (a worker
        Request, or a run's Celery ``Context``): False when the copy held is stale
        (drop it, publish nothing).

        Raises:
            BackendError: when the funnels' Redis fails (publish nothing).
            CopiesBusyError: another send of its task id goes first (publish nothing).
        """
        if self.store is None:
            return True
        self.runtime.outage.check()
        context = getattr(request, "_context", request)
        return self.store.move(request.id, state.release, token, origin(context))

    def watch_ack(self, request: Any, state: State) -> None:
        """Keep ``request`` (admitted, its copy ``state.release``) in mind until its
        message is acked (or rejected), and, where acks are not confirmed
        (``unconfirmed_acks``: AMQP), for ``CUT_SECONDS`` after (``runs_cut``)."""
        message = getattr(request, "message", None)
        if self.store is None or message is None:
            return
        key = id(request)
        self.unacked[key] = (request.id, state.release, request)
        # Celery acks and rejects through these: the ones on the instance, removed at the
        # ack or reject, so that no cycle (message -> its ack -> message) outlives it: the
        # garbage collector freeing one per run cost a tenth of a fast task's time
        message.ack = functools.partial(self._acked, key, message)
        message.reject = functools.partial(self._rejected, key, message)

    def _acked(self, key: int, message: Any, *args: Any, **kw: Any) -> Any:
        _unwatch(message)
        result = message.ack(*args, **kw)  # a failed ack keeps the run in mind (unacked)
        found = self.unacked.pop(key, None)
        if found is not None and self.unconfirmed_acks:
            self.acked.append((time.monotonic(), found[0], found[1]))
        return result

    def _rejected(self, key: int, message: Any, *args: Any, **kw: Any) -> Any:
        _unwatch(message)
        self.unacked.pop(key, None)  # requeued on purpose (Reject), or discarded: not a run
        return message.reject(*args, **kw)

    def runs_cut(self) -> int:
        """The broker connection died: the broker gives again every message it holds
        un-acked from it (kombu's Redis transport at once, as the connection is torn
        down; RabbitMQ when it sees the connection gone), those of runs that started
        among them: admitted runs that started (in the pool) and whose message is not
        acked, and, on AMQP (acks not confirmed), the runs acked in the last
        ``CUT_SECONDS`` (the ack may have died with the connection). Record that each
        started (``Copies.ran``), so that the message delivered again is dropped, not
        run a second time. A run admitted but never started (Celery drops those with
        the connection) is not recorded: its message runs when delivered again. Returns
        how many it recorded; never raises (one not recorded is Celery's at-least-once)."""
        if self.store is None:
            return 0
        since = time.monotonic() - CUT_SECONDS
        started = [(i, t) for i, t, request in self.unacked.values() if _may_have_started(request)]
        runs = dict.fromkeys([*started, *((i, t) for at, i, t in self.acked if at >= since)])
        self.unacked.clear()
        self.acked.clear()
        try:
            recorded = self.store.ran(runs)
        except Exception as error:  # the funnels' Redis failed too: at-least-once
            logger.warning("celery-funnel: %d run(s) cut off by the broker connection may"
                           " run again: %r", len(runs), error)  # fmt: skip
            return 0
        if recorded:
            logger.info("celery-funnel: %d run(s) started before the broker connection died:"
                        " their messages delivered again are dropped", recorded)  # fmt: skip
        return recorded


def _may_have_started(request: Any) -> bool:
    """Whether the run of ``request`` (a Celery worker Request handed to the pool) may
    have started: its pool process accepted it, or was given it (the prefork pool tells
    the main process it started only through its event loop, which may be stuck), or a
    pool whose jobs cannot be told apart ran it. False for a prefork job still waiting to
    be written to a process, which Celery drops with the connection."""
    if request.time_start:
        return True
    result = request._apply_result() if request._apply_result is not None else None
    if result is None:  # not handed to the pool yet (Celery's rate-limit bucket)
        return False
    if not hasattr(result, "_write_to"):  # another pool than prefork: assume it ran
        return True
    return bool(result._write_to or getattr(result, "_scheduled_for", None))


def _unwatch(message: Any) -> None:
    """``message``'s own ack and reject again (``CopyGuard.watch_ack`` set others)."""
    attributes = vars(message)
    attributes.pop("ack", None)
    attributes.pop("reject", None)
