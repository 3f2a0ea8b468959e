"""The hand-off listener (``HandOffListener``): where nothing may be parked, a run refused a seat
is a held waiter, held in its worker and queued in the funnels' Redis. The script that
frees a seat hands it to the first waiter and, for a held one, publishes its task id on
its worker's channel (``handed_channel``); this thread, subscribed to that channel in
the worker's main process, wakes the held request on the event loop at once
(``Held.wake_tasks``), which takes its seat and runs.

One thread per worker, started at the first held waiter. A message lost (the channel
down, a reconnect) costs a held waiter at most its next look (``LOOK_SECONDS``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .._limiter.keys import handed_channel
from .._stores.store import text
from .loop import Loop, log_failure

__all__ = ["HandOffListener"]

logger = logging.getLogger("celery_funnel")

LISTEN_SECONDS = 1.0  # one read of the channel waits this long at most (then: stopped?)
ERROR_PAUSE_SECONDS = 1.0  # after the channel failed, subscribed again after this


class HandOffListener(Loop):
    """Listens on worker ``node``'s channel (under ``prefix``) of the funnels' Redis
    (``client()``, redis-py) and calls ``wake_tasks(task_ids)`` with the waiters handed a
    seat: a ``Loop`` whose pass reads the channel for up to ``LISTEN_SECONDS``,
    subscribed again after a failure (``error_pause``)."""

    name = "celery-funnel-handoff"
    error_pause = ERROR_PAUSE_SECONDS

    def __init__(
        self, client: Callable[[], Any], prefix: str, node: str,
        wake_tasks: Callable[[list[str]], Any],
    ) -> None:  # fmt: skip
        super().__init__()
        self.client, self.wake_tasks = client, wake_tasks
        self.channel = handed_channel(prefix, node)
        self._lock = threading.Lock()
        self._started = False
        self._pubsub: Any = None  # subscribed to ``channel`` (None: not now)

    def start(self) -> None:
        """Start listening (once; later calls do nothing)."""
        with self._lock:
            if self._started or self._stopped.is_set():
                return
            self._started = True
        super().start()

    def stop(self, timeout: float = LISTEN_SECONDS + 1.0) -> None:
        """Stop listening (the worker shuts down)."""
        if self._thread is threading.current_thread():
            self._stopped.set()  # asked by a callback of its own: ends after this pass
            return
        super().stop(timeout)
        if not self._thread.is_alive():  # else its pass closes the channel as it ends
            self._close()

    def failed(self, error: Exception) -> None:
        log_failure("listening for seats handed to held waiters", error)

    def tick(self) -> float:
        try:
            if self._pubsub is None:
                self._pubsub = self.client().pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(self.channel)
            self._read(self._pubsub)
            if self._stopped.is_set():
                self._close()
        except Exception:
            self._close()  # subscribed again after the pause
            raise
        return 0.0

    def _read(self, pubsub: Any) -> None:
        """Wake each waiter told of within one wait of ``LISTEN_SECONDS``."""
        message = pubsub.get_message(timeout=LISTEN_SECONDS)
        if message is None or message.get("type") != "message":
            return
        woken = [text(message["data"])]
        while (more := pubsub.get_message(timeout=0.0)) is not None:
            if more.get("type") == "message":
                woken.append(text(more["data"]))
        self.wake_tasks(woken)

    def _close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception as error:  # a connection gone already: nothing to close
                logger.debug("celery-funnel: %r", error)
