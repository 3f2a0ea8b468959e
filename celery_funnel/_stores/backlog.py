"""The backlog of a funnel: its tasks sent and not yet started (``funnel_max_waiting``),
kept beside the funnel (``<funnel key>#backlog``). A producer enters each task before
it publishes it and is refused while the backlog is full; the task leaves when it
starts, is revoked or expires, or fails in the gate. An entry whose leaving was never
seen (its producer died between entering and publishing, its message was purged)
counts for ``ttl`` seconds at most: the count heals itself."""

from __future__ import annotations

from .._limiter.keys import backlog_key
from .._limiter.scripts import RedisClient
from .store import RedisStore

__all__ = ["TTL_SECONDS", "Backlog"]

US = 1_000_000
TTL_SECONDS = 3600.0  # how long an entry counts at most: a backlog longer than this under-counts


class Backlog(RedisStore):
    """The backlogs of funnels in the funnels' Redis (``client``, redis-py).

    Raises (every method): ``BackendError`` when Redis fails.
    """

    what = "the backlog of tasks not yet started"

    def __init__(self, client: RedisClient, ttl: float = TTL_SECONDS) -> None:
        super().__init__(client)
        self.ttl = ttl
        self._enter = self._register("_clock", "backlog_enter")

    def enter(
        self, funnel: str, task_id: str, most: int, *, force: bool = False
    ) -> tuple[bool, int]:
        """Count task ``task_id`` in funnel ``funnel``'s backlog unless ``most`` wait
        already (``force``: in any case, a task accepted before): whether it was
        counted, and how many wait now."""
        key = backlog_key(funnel)
        ttl = round(self.ttl * US)
        reply = self._script(self._enter, [key], "", task_id, most, ttl, "1" if force else "")
        return bool(reply[0]), int(reply[1])

    def leave(self, funnel: str, task_id: str) -> None:
        """Task ``task_id`` started, or will never start: it no longer waits."""
        self._method("zrem", backlog_key(funnel), task_id)

    def count(self, funnel: str) -> int:
        """How many tasks of funnel ``funnel`` wait (sent, not yet started)."""
        reply = self._method("execute_command", "TIME")
        now = int(reply[0]) * US + int(reply[1])
        return int(self._method("zcount", backlog_key(funnel), f"({now}", "+inf"))
