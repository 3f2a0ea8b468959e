"""Calls onto the consumer's event loop from another thread, run at once (``Nudge``).

A timer entry added from another thread waits for the event loop's next wake-up: kombu's
hub sleeps in its poller up to the next timer entry it knew of (seconds). A nudge wakes
it now: each call is queued and a byte written to a pipe whose read end the hub watches;
the hub's reader runs every queued call on the loop. A timer entry for the same calls is
added too, as a backstop (a hub restarted without the reader, a worker without a hub:
Celery's thread timer runs it), and finds nothing left when the reader ran first. The
reader is added to the hub on the loop itself (``watch``: by the holder of what may be
woken, as it holds, and by every run of the calls; the hub's tables are the loop's own,
no other thread changes them); until then, and after a hub restart, the timer alone
runs the calls.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Nudge"]

logger = logging.getLogger("celery_funnel")

Call = tuple[Callable[..., Any], tuple[Any, ...]]


class Nudge:
    """Runs calls on ``consumer``'s event loop (its ``hub``, else its ``timer``), asked
    from any thread."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self._calls: deque[Call] = deque()
        self._lock = threading.Lock()
        self._pipe: tuple[int, int] | None = None

    def call(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` on the event loop, as soon as it can. Never raises."""
        self._calls.append((function, args))
        try:
            self._poke()
        except Exception as error:  # the backstop below still runs it
            logger.debug("celery-funnel: could not wake the event loop: %r", error)
        self.consumer.timer.call_after(0.0, self.run, (), priority=6)

    def _poke(self) -> None:
        hub = getattr(self.consumer, "hub", None)
        pipe = self._pipe
        if hub is None or pipe is None or pipe[0] not in getattr(hub, "readers", {}):
            return  # not watched (yet): the timer entry runs the calls
        with contextlib.suppress(BlockingIOError):  # full: the loop is woken already
            os.write(pipe[1], b"!")

    def watch(self) -> None:
        """On the event loop: have the hub watch the pipe (first use, or a restarted
        hub). Never raises: unwatched, the timer entries run the calls."""
        hub = getattr(self.consumer, "hub", None)
        if hub is None or not hasattr(hub, "add_reader"):
            return
        try:
            with self._lock:
                if self._pipe is None:
                    read, write = os.pipe()
                    os.set_blocking(read, False)
                    os.set_blocking(write, False)
                    self._pipe = (read, write)
                if self._pipe[0] not in getattr(hub, "readers", {}):
                    hub.add_reader(self._pipe[0], self._readable)
        except Exception as error:
            logger.debug("celery-funnel: could not watch the nudge pipe: %r", error)

    def _readable(self) -> None:
        pipe = self._pipe
        if pipe is not None:
            try:
                while os.read(pipe[0], 4096):
                    pass
            except BlockingIOError:
                pass
        self.run()

    def run(self) -> None:
        """Run every queued call (on the event loop); a call that raises is logged."""
        self.watch()
        while self._calls:
            try:
                function, args = self._calls.popleft()
            except IndexError:
                return
            try:
                function(*args)
            except Exception:  # one call fails, the others run
                logger.exception("celery-funnel: a call woken on the event loop failed")

    def close(self) -> None:
        """Stop watching the pipe and close it (the worker shuts down)."""
        with self._lock:
            pipe, self._pipe = self._pipe, None
        if pipe is None:
            return
        hub = getattr(self.consumer, "hub", None)
        try:
            if hub is not None:
                hub.remove_reader(pipe[0])
        except Exception as error:  # a hub already closed: nothing to remove
            logger.debug("celery-funnel: %r", error)
        for fd in pipe:
            os.close(fd)
