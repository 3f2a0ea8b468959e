"""Whether a task may be parked in the funnels' Redis, and whether it restarted.

Parking moves a waiting task's only copy out of the broker into the funnels' Redis. The
rule: a task waits nowhere less safe than the broker's queue (``Rule``). The funnels'
Redis keeps a parked task as well as the broker keeps a queued one when it has an
append-only file (``INFO persistence``: ``aof_enabled``, on every node of a Cluster),
or when it is the broker's own Redis server (the same ``run_id`` in ``INFO server``;
another database number on it counts as the same server): a restart that forgets the
one forgets the other. Read at worker start, again at most every ``RECHECK_SECONDS``
while tasks wait, after an outage of that Redis and after a reconnect to the broker.
RDB snapshots alone do not count: they lose what came since the last one. A change of
``run_id`` tells a restart, which is logged. ``funnel_park``: ``"auto"`` parks where
the rule allows; ``True`` insists (a Redis the rule refuses stops the worker at start);
``False`` never parks.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .._limiter.errors import ConfigurationError

__all__ = [
    "RECHECK_SECONDS", "Persistence", "Rule", "aof_everywhere", "info_per_node",
    "read_persistence", "run_id_of",
]  # fmt: skip

logger = logging.getLogger("celery_funnel")

RECHECK_SECONDS = 10.0
OFF = (
    "long waits go back to the broker with capped countdowns, tasks waiting for a"
    " concurrency slot are held in the worker, queued in arrival order and woken when"
    " handed a slot, fair share"
    " refuses to start (or, turned off while running, acts as an ordinary funnel)"
)


class Rule(enum.Enum):
    """Why a task may be parked in the funnels' Redis (``AOF``, ``BROKER``), or why not
    (``NONE``): a task waits nowhere less safe than the broker's queue."""

    AOF = "the funnels' Redis has an append-only file"
    BROKER = (
        "the funnels' Redis is the broker's own Redis server (no append-only file: a"
        " parked task is as safe as the tasks queued beside it, a restart loses both)"
    )
    NONE = "the funnels' Redis has no append-only file and is not the broker's Redis server"

    @property
    def parks(self) -> bool:
        """Whether the rule lets a task be parked."""
        return self is not Rule.NONE


def info_per_node(client: Any, section: str) -> list[dict[str, Any]]:
    """``INFO section`` of every master of ``client``'s Redis: one answer for a single
    server, one per primary for a Redis Cluster (redis-py asks only one node unless it
    is told which).

    Raises:
        redis.RedisError: when Redis fails or refuses INFO.
    """
    primaries = getattr(client, "PRIMARIES", None)  # a RedisCluster client
    info = client.info(section, target_nodes=primaries) if primaries else client.info(section)
    nested = [value for value in info.values() if isinstance(value, dict)]
    return nested or [info]


def aof_everywhere(client: Any) -> bool:
    """Whether every master of ``client``'s Redis has an append-only file.

    Raises:
        redis.RedisError: when Redis fails or refuses INFO.
    """
    return all(
        str(node.get("aof_enabled", "0")) == "1" for node in info_per_node(client, "persistence")
    )


def read_persistence(client: Any) -> tuple[bool, str]:
    """Whether every node of ``client``'s Redis has AOF on, and its run id(s).

    Raises:
        redis.RedisError: when Redis fails or refuses INFO.
    """
    return aof_everywhere(client), run_id_of(client)


def run_id_of(client: Any) -> str:
    """The ``run_id`` of ``client``'s Redis server (``INFO server``).

    Raises:
        redis.RedisError: when Redis fails or refuses INFO.
    """
    return ",".join(sorted(str(node.get("run_id", "")) for node in info_per_node(client, "server")))


class Persistence:
    """Whether tasks may be parked in the funnels' Redis (``client()``: its client now)
    under the ``funnel_park`` mode ``mode`` ("auto", True or False), by the ``Rule``;
    ``broker()``: the broker's Redis client (None: the broker is not a Redis server
    this can ask, ``broker_why`` says what it is), asked for INFO only. Thread-safe:
    the worker gate, the releaser and a producer's debounced sends ask."""

    def __init__(
        self,
        client: Callable[[], Any],
        mode: bool | str,
        clock: Callable[[], float] = time.monotonic,
        *,
        broker: Callable[[], Any] | None = None,
        broker_why: str = "",
    ) -> None:
        self.client, self.mode, self.clock = client, mode, clock
        self.broker, self.broker_why = broker, broker_why
        self._lock = threading.Lock()
        self._checked = -math.inf
        self._aof: bool | None = None  # None: not known (never read, INFO refused)
        self._same: bool | None = None  # the broker's own server; None: not known
        self._run_id: str | None = None

    def keeps(self) -> bool:
        """Whether a task may be parked now: the rule allowed it in the last
        ``RECHECK_SECONDS`` (with ``funnel_park=True`` also while that cannot be read).
        Never raises."""
        if self.mode is False:
            return False
        rule = self.rule()
        return self.mode is True if rule is None else rule.parks

    def rule(self) -> Rule | None:
        """The rule that applies now (read again at most every ``RECHECK_SECONDS``);
        None when the funnels' Redis cannot be read. Never raises."""
        if self.clock() - self._checked >= RECHECK_SECONDS:
            with self._lock:
                if self.clock() - self._checked >= RECHECK_SECONDS:
                    self._refresh()
        return self._rule()

    def aof(self) -> bool | None:
        """Whether the funnels' Redis has AOF on (read again at most every
        ``RECHECK_SECONDS``); None when it cannot be read. Never raises."""
        self.rule()
        return self._aof

    def _rule(self) -> Rule | None:
        if self._aof is None:
            return None
        if self._aof:
            return Rule.AOF
        if self._same is None:  # the broker could not be read since a restart
            return None
        return Rule.BROKER if self._same else Rule.NONE

    def stale(self) -> None:
        """Read both Redis again at the next ``keeps()`` (one answered again after an
        outage, or the broker connection was made again: either may have restarted)."""
        self._checked = -math.inf

    def describe(self) -> str:
        """Which rule applies, in one line (reads now)."""
        if self.mode is False:
            return "off (funnel_park=False)"
        with self._lock:
            self._refresh()
        rule = self._rule()
        if rule is None:
            return "not known: the funnels' Redis does not answer INFO"
        why = f" ({self.broker_why})" if rule is Rule.NONE and self.broker_why else ""
        return f"{'on' if rule.parks else 'off'}: {rule.value}{why}"

    def start(self) -> None:
        """Read the Redis at worker start and say once which rule applies.

        Raises:
            ConfigurationError: ``funnel_park=True`` where the rule refuses parking.
        """
        if self.mode is False:
            return
        with self._lock:
            self._refresh()
        rule = self._rule()
        why = f" ({self.broker_why})" if self.broker_why else ""
        if rule is Rule.NONE and self.mode is True:
            raise ConfigurationError(
                f"funnel_park=True, but {rule.value}{why}: a restart would lose every"
                " parked task; turn on 'appendonly yes' there, keep the funnels on the"
                " broker's Redis, or set funnel_park='auto' (park only where that is safe)"
            )
        if rule is Rule.NONE:
            logger.info(
                "celery-funnel: parking is off: %s%s, and a restart would lose parked"
                " tasks; %s (turn on 'appendonly yes' to park)", rule.value, why, OFF,
            )  # fmt: skip
        elif rule is None and self.mode == "auto":
            logger.info(
                "celery-funnel: parking is off until the funnels' Redis answers INFO"
                " (it must have an append-only file or be the broker's Redis server); %s",
                OFF,
            )
        elif rule is not None:
            logger.info("celery-funnel: parking is on: %s", rule.value)

    def _refresh(self) -> None:
        self._checked = self.clock()
        before = self._rule()
        try:
            aof, run_id = read_persistence(self.client())
        except Exception as error:  # down, or INFO refused: keep what was known
            logger.debug("celery-funnel: cannot read the funnels' Redis persistence: %r", error)
            return
        restarted = self._run_id is not None and run_id != self._run_id
        same = False if aof else self._same_server(run_id, keep=not restarted)
        if restarted:
            logger.warning(
                "celery-funnel: the funnels' Redis restarted (run_id %s -> %s)%s",
                self._run_id, run_id, _restart(before, aof),
            )  # fmt: skip
        self._aof, self._same, self._run_id = aof, same, run_id
        after = self._rule()
        if before is not None and after is not None and before.parks != after.parks:
            logger.warning(
                "celery-funnel: parking %s: %s",
                "starts" if after.parks else f"stops ({OFF})", after.value,
            )  # fmt: skip

    def _same_server(self, run_id: str, *, keep: bool) -> bool | None:
        """Whether the broker is the Redis server of ``run_id``; when the broker cannot
        be read, what was known (``keep``: the funnels' Redis did not restart), else
        None."""
        if self.broker is None:
            return False
        try:
            client = self.broker()
            return client is not None and run_id_of(client) == run_id
        except Exception as error:
            logger.debug("celery-funnel: cannot read the broker's Redis run_id: %r", error)
            return self._same if keep else None


def _restart(before: Rule | None, aof: bool) -> str:
    """What a restart of the funnels' Redis did to its parked tasks (parked under
    ``before``)."""
    if aof:
        return ": its append-only file kept the parked tasks"
    if before is Rule.BROKER:
        return (
            ": it is the broker's own server and kept nothing: the tasks parked there"
            " were lost with the tasks queued in the broker (as Celery loses those), and"
            " every funnel starts afresh"
        )
    return (
        ": it kept nothing, so every funnel starts afresh; no task was parked there, and"
        " the tasks held in workers are decided again"
    )
