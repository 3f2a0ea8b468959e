"""Whether the funnels' Redis keeps what it is given, and whether it restarted.

Parking moves a waiting task's only copy out of the broker into the funnels' Redis. A
Redis without an append-only file forgets it on a restart, with nothing logged, so a
task is parked only while that Redis has AOF on (``INFO persistence``: ``aof_enabled``,
on every node of a Cluster): read at worker start, again at most every
``RECHECK_SECONDS`` while tasks wait, and after an outage of that Redis. RDB snapshots
alone do not count: they lose what came since the last one. The ``run_id`` (``INFO
server``) tells a restart, which is logged. ``funnel_park``: ``"auto"`` parks where AOF
is on; ``True`` insists (a Redis without AOF stops the worker at start); ``False`` never
parks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .._limiter.errors import ConfigurationError

__all__ = ["RECHECK_SECONDS", "Persistence", "aof_everywhere", "read_persistence"]

logger = logging.getLogger("celery_funnel")

RECHECK_SECONDS = 10.0
OFF = (
    "long waits go back to the broker with capped countdowns, tasks waiting for a"
    " concurrency slot are held in the worker and looked at again every 0.5 s, fair share"
    " acts as an ordinary funnel"
)


def _nodes(info: dict[str, Any]) -> list[dict[str, Any]]:
    """One INFO answer per node: a Cluster client answers a dict of them."""
    nested = [value for value in info.values() if isinstance(value, dict)]
    return nested or [info]


def aof_everywhere(client: Any) -> bool:
    """Whether every node of ``client``'s Redis has an append-only file.

    Raises:
        redis.RedisError: when Redis fails or refuses INFO.
    """
    return all(
        str(node.get("aof_enabled", "0")) == "1" for node in _nodes(client.info("persistence"))
    )


def read_persistence(client: Any) -> tuple[bool, str]:
    """Whether every node of ``client``'s Redis has AOF on, and its run id(s).

    Raises:
        redis.RedisError: when Redis fails or refuses INFO.
    """
    run_id = ",".join(sorted(str(node.get("run_id", "")) for node in _nodes(client.info("server"))))
    return aof_everywhere(client), run_id


class Persistence:
    """Whether tasks may be parked in the funnels' Redis (``client()``: its client now)
    under the ``funnel_park`` mode ``mode`` ("auto", True or False). Thread-safe: the
    worker gate and the releaser both ask."""

    def __init__(
        self,
        client: Callable[[], Any],
        mode: bool | str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.mode, self.clock = client, mode, clock
        self._lock = threading.Lock()
        self._checked = -math.inf
        self._aof: bool | None = None  # None: not known (never read, INFO refused)
        self._run_id: str | None = None

    def keeps(self) -> bool:
        """Whether a task may be parked now: AOF seen on in the last ``RECHECK_SECONDS``
        (with ``funnel_park=True`` also while that cannot be read). Never raises."""
        if self.mode is False:
            return False
        if self.clock() - self._checked >= RECHECK_SECONDS:
            with self._lock:
                if self.clock() - self._checked >= RECHECK_SECONDS:
                    self._refresh()
        return self.mode is True if self._aof is None else self._aof

    def stale(self) -> None:
        """Read the Redis again at the next ``keeps()`` (it answered again after an
        outage: it may have restarted)."""
        self._checked = -math.inf

    def start(self) -> None:
        """Read the Redis at worker start and say once why parking is off.

        Raises:
            ConfigurationError: ``funnel_park=True`` on a Redis without AOF.
        """
        if self.mode is False:
            return
        with self._lock:
            self._refresh()
        if self._aof is False and self.mode is True:
            raise ConfigurationError(
                "funnel_park=True, but the funnels' Redis has no append-only file"
                " (appendonly no): a restart would lose every parked task; turn on"
                " 'appendonly yes' there, or set funnel_park='auto' (park only where AOF is on)"
            )
        if self._aof is False:
            logger.info(
                "celery-funnel: parking is off: the funnels' Redis has no append-only file,"
                " and a restart would lose parked tasks; %s (turn on 'appendonly yes' to park)",
                OFF,
            )
        elif self._aof is None and self.mode == "auto":
            logger.info(
                "celery-funnel: parking is off until the funnels' Redis answers INFO"
                " persistence (it must have an append-only file); %s",
                OFF,
            )

    def _refresh(self) -> None:
        self._checked = self.clock()
        try:
            aof, run_id = read_persistence(self.client())
        except Exception as error:  # down, or INFO refused: keep what was known
            logger.debug("celery-funnel: cannot read the funnels' Redis persistence: %r", error)
            return
        if self._run_id is not None and run_id != self._run_id:
            logger.warning(
                "celery-funnel: the funnels' Redis restarted (run_id %s -> %s)%s",
                self._run_id, run_id,
                ": its append-only file kept the parked tasks" if aof else
                ": it kept nothing, so every funnel starts afresh; no task was parked"
                " there, and the tasks held in workers are decided again",
            )  # fmt: skip
        if self._aof is not None and aof != self._aof:
            logger.warning(
                "celery-funnel: the funnels' Redis turned its append-only file %s: parking %s",
                "on" if aof else "off",
                "starts" if aof else f"stops ({OFF})",
            )
        self._aof, self._run_id = aof, run_id
