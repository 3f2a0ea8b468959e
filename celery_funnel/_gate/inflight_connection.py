"""Decisions in flight: the worker gate sends a first arrival's decision (one script)
without waiting for the reply, on a connection of its own that the consumer's event loop reads, and
carries the request on when the reply arrives.

Waiting for the reply on the event loop's thread stalls everything else the consumer
does for a round trip, plus the wake-up (and, on the threads pool, the wait for the
GIL): about twice the decision's own time, measured on one worker. Here the call is
what the decision would send (``backends._chain.Capture`` records it), and the reply
is decoded by the same decision replayed on it (``Replay``), so both ways decide alike.

Replies come back in the order the calls went out (one connection). A reply that is an
error, or a connection that fails, sends each request still waiting through the
ordinary decision (which reloads a lost script and applies the outage policy): at
worst a request is charged twice, which admits less, never more. So does a reply that
does not come within the socket timeout (a Redis that hangs: a network cut), which
also tells the outage log (``on_timeout``): the requests never wait on a silent
connection past what the broker lets the worker keep them. When the broker
connection closes, the requests in flight are forgotten, as held ones are: the broker
delivers them again.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from functools import cached_property
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._limiter.backends._chain import Capture, Captured, Replay
from .._limiter.scripts import Call
from .inflight_lean import Lean, lean

__all__ = ["InFlight"]

logger = logging.getLogger("celery_funnel")
T = TypeVar("T")

# Decisions go in flight only while no task is deferred: a limited funnel's tasks are
# decided as before, each waiting for its reply. A 10 000-task burst at 500/s, all its
# decisions in flight, took 142 s (its tickets went stale over and over while the
# busier consumers fell behind) against 54 s waiting for each reply.
CALM_SECONDS = 1.0

Resume = Callable[[Any], None]
"""Carries one request on: called with the reply, or with the exception that stands
for it (an error reply, a lost connection)."""


class InFlight:
    """The gate's decisions in flight on the store ``funnel()`` gives (a
    ``RedisFunnel``), read by ``hub`` (the consumer's event loop; None: every decision
    waits for its reply)."""

    def __init__(
        self,
        funnel: Callable[[], Any],
        hub: Any,
        timeout: float = 1.0,
        on_timeout: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.funnel, self.hub, self.timeout, self.on_timeout = funnel, hub, timeout, on_timeout
        self.connection: Any = None
        self.fd: int | None = None
        self.lean: Lean | None = None  # its socket read directly (inflight_lean)
        self.pending: deque[Resume] = deque()
        self.sent: deque[float] = deque()  # when each pending call went (monotonic)
        self._watchdog: Any = None  # the hub's timer entry that looks for late replies
        self.calm_from = 0.0  # monotonic time from which decisions go in flight again

    @cached_property
    def pool(self) -> Any:
        """The funnel client's connection pool (None: a Cluster, or no Redis)."""
        return getattr(getattr(self.funnel(), "client", None), "connection_pool", None)

    @property
    def on(self) -> bool:
        """Whether decisions can be sent without waiting (a hub, a pooled client), and
        none was deferred in the last ``CALM_SECONDS``."""
        if time.monotonic() < self.calm_from:
            return False
        return self.hub is not None and hasattr(self.hub, "add_reader") and self.pool is not None

    def deferred(self) -> None:
        """A decision deferred its task: decide the next ones waiting for the reply,
        until the funnels have been calm for ``CALM_SECONDS``."""
        self.calm_from = time.monotonic() + CALM_SECONDS

    @staticmethod
    def capture(decide: Callable[[Any], T]) -> tuple[Call | None, T | None]:
        """The one script call ``decide(store)`` makes, or ``(None, its answer)`` when
        it decided without one."""
        try:
            return None, decide(Capture())
        except Captured as captured:
            return captured.call, None

    def send(self, call: Call, resume: Resume) -> None:
        """Send ``call``; ``resume`` gets its reply from the event loop.

        Raises:
            RedisError, OSError: when the call cannot be sent (nothing is pending then).
        """
        script, keys, args = call
        connection = self._connection()
        try:
            if self.lean is not None:
                self.lean.send("EVALSHA", script.sha, len(keys), *keys, *args)
            else:
                connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except (RedisError, OSError):
            self._lost(RedisConnectionError("sending a decision failed"))
            raise
        self.pending.append(resume)
        self.sent.append(time.monotonic())
        if self._watchdog is None:
            self._watchdog = self.hub.call_later(self.timeout, self._watch)

    def _watch(self) -> None:
        """The oldest call waits too long for its reply: the connection is lost."""
        self._watchdog = None
        if not self.pending:
            return
        age = time.monotonic() - self.sent[0]
        if age < self.timeout:
            self._watchdog = self.hub.call_later(self.timeout - age, self._watch)
            return
        error = RedisTimeoutError(f"no reply to a decision in {age:.1f} s")
        if self.on_timeout is not None:
            self.on_timeout(error)
        self._lost(error)

    @staticmethod
    def replay(reply: Any, fallback: Any) -> Replay:
        """The store on which a decision replayed gets ``reply`` for its call."""
        return Replay(reply if isinstance(reply, list) else [reply], fallback)

    def _connection(self) -> Any:
        if self.connection is None:
            try:
                connection = self.pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                connection = self.pool.get_connection("EVALSHA")
            connection.connect()
            self.connection, self.fd = connection, connection._sock.fileno()
            self.lean = lean(connection)
        if self.fd not in getattr(self.hub, "readers", {}):  # a restarted consumer's hub
            self.hub.add_reader(self.fd, self._on_readable)
        return self.connection

    def _on_readable(self, *_: Any) -> None:
        if self.lean is not None:
            return self._read_lean(self.lean)
        while self.pending:
            try:
                if not self.connection.can_read(timeout=0):
                    return None
                reply: Any = self.connection.read_response()
            except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                return self._lost(error)
            except RedisError as error:  # an error reply: that call's answer
                reply = error
            self._resume_next(reply)
        return None

    def _read_lean(self, way: Lean) -> None:
        try:
            replies = way.replies()
        except (RedisError, OSError) as error:  # closed, or not the protocol
            return self._lost(error)
        for reply in replies:
            if not self.pending:  # dropped meanwhile: the rest went with the connection
                return None
            self._resume_next(reply)
        return None

    def _resume_next(self, reply: Any) -> None:
        resume = self.pending.popleft()
        self.sent.popleft()
        try:
            resume(reply)
        except Exception:  # one request's trouble must not stop the event loop
            logger.exception("celery-funnel: carrying a decided request on failed")

    def _lost(self, error: BaseException) -> None:
        """The connection failed: every request waiting goes the ordinary way."""
        waiting, self.pending = self.pending, deque()
        self.sent.clear()
        self._close()
        for resume in waiting:
            resume(error)

    def drop(self) -> int:
        """Forget the requests in flight (the broker will deliver them again)."""
        dropped = len(self.pending)
        self.pending.clear()
        self.sent.clear()
        self._close()  # their replies, still to come, go with the connection
        return dropped

    def _close(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        connection, self.connection, self.lean = self.connection, None, None
        if connection is None:
            return
        try:
            if self.fd is not None and self.hub is not None:
                self.hub.remove_reader(self.fd)
        except Exception as error:  # a hub already closed: nothing to remove
            logger.debug("celery-funnel: removing the decision reader: %r", error)
        connection.disconnect()
        self.pool.release(connection)
        self.fd = None

    def close(self) -> None:
        """At worker shutdown: forget what is in flight, give the connection back."""
        self.drop()
