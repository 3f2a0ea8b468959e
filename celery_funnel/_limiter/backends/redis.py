"""``RedisFunnel``: funnels in Redis, one EVALSHA per decision."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import BackendConfigurationError, BackendError, ConfigurationError
from ..keys import tickets_key
from ..scripts import Arg, Call, RedisClient, Reply, Script
from . import _chain
from ._clients import client_from_url
from ._faults import configuration_fault
from .base import Funnel

US = 1_000_000
T = TypeVar("T")

# A dead Redis must cost a caller a short wait, never a hang.
DEFAULT_TIMEOUT_SECONDS = 2.0


def failure(doing: str, error: Exception) -> BackendError | BackendConfigurationError:
    """The package's error for a Redis ``error`` met while ``doing`` something: a
    ``BackendConfigurationError`` saying what to fix for a configuration fault, else a
    ``BackendError`` (an outage)."""
    fix = configuration_fault(error)
    if fix is not None:
        return BackendConfigurationError(f"Redis refused {doing}: {fix} (Redis said: {error})")
    return BackendError(f"Redis failed {doing}: {error}")


# what redis-py raises when a command fails; RedisClusterException: a slot not covered
FAILURES = (RedisError, RedisClusterException)


def evalsha(call: Call) -> tuple[Arg, ...]:
    """The EVALSHA command of one script call."""
    script, keys, args = call
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


def as_reply(reply: Any) -> Reply:
    """A script's reply as a list (a script returning one number replies a number)."""
    return reply if isinstance(reply, list) else [reply]


def lost(replies: Sequence[Any]) -> list[int]:
    """Where a pipeline's replies say NOSCRIPT: the scripts to load and run again."""
    return [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]


def checked(calls: Sequence[Call], replies: Sequence[Any]) -> list[Reply]:
    """A pipeline's replies to ``calls`` (``raise_on_error=False``) as script replies.

    Raises:
        BackendError, BackendConfigurationError: for the first reply that is an error.
    """
    for (script, _, _), reply in zip(calls, replies, strict=True):
        if isinstance(reply, Exception):
            raise failure(f"running {script.name}.lua", reply)
    return [as_reply(reply) for reply in replies]


def server_seconds(time_reply: Sequence[Any]) -> float:
    """A ``TIME`` reply (seconds, microseconds) as float seconds since the epoch."""
    seconds, micros = time_reply
    return int(seconds) + int(micros) / US


def booked_slots(booked: Sequence[tuple[bytes, float]]) -> list[tuple[str, float]]:
    """A tickets sorted set read ``withscores`` as (ticket, slot in epoch seconds)."""
    return [(ticket.decode(), slot / US) for ticket, slot in booked]


class RedisFunnel(Funnel):
    """Funnels kept in Redis (>= 5): standalone, Redis Cluster or a Sentinel master.

    Every decision is one EVALSHA of a script loaded once; after a ``SCRIPT FLUSH`` or
    a failover the script is loaded again and the call retried (NOSCRIPT). The Redis
    server's ``TIME`` is the clock of every decision, so workers with skewed clocks
    share one timeline.

    Args:
        client: a redis-py ``Redis``, ``RedisCluster`` or Sentinel master client.
    """

    def __init__(self, client: Any) -> None:
        if not hasattr(client, "execute_command"):
            raise ConfigurationError(f"RedisFunnel needs a redis-py client, got {client!r}")
        self.client: RedisClient = client
        self._lean = _Lean(client)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisFunnel:
        """A ``RedisFunnel`` on a new client for ``url``: ``redis://``, ``rediss://``,
        ``unix://``, ``redis+cluster://host:port[,...]`` (Redis Cluster) or
        ``redis+sentinel://host:port[,...]/service[/db]`` (Sentinel). Socket timeouts
        default to 2 seconds; ``options`` go to the redis-py client.

        Raises:
            ConfigurationError: when the URL cannot be parsed.
        """
        options.setdefault("socket_timeout", DEFAULT_TIMEOUT_SECONDS)
        options.setdefault("socket_connect_timeout", DEFAULT_TIMEOUT_SECONDS)
        return cls(client_from_url(url, **options))

    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        command = evalsha((script, keys, args))
        try:
            try:
                reply = self._lean.call(command)
            except NoScriptError:
                self.client.script_load(script.source)
                reply = self._lean.call(command)
        except FAILURES as exc:
            raise failure(f"running {script.name}.lua", exc) from exc
        return as_reply(reply)

    def _decide_in_order(
        self, decisions: Sequence[Callable[[Funnel], T]], admits: Callable[[T], bool]
    ) -> list[T]:
        """The decisions' scripts as one script (``backends/_chain.py``), where they can be."""
        answers = _chain.chained(self._eval, decisions, admits, self._one_slot)
        return answers if answers is not None else super()._decide_in_order(decisions, admits)

    def _one_slot(self, keys: Sequence[str]) -> bool:
        """Whether one script may take ``keys``: always, but on a Cluster one slot."""
        keyslot = getattr(self.client, "keyslot", None)
        return keyslot is None or len({keyslot(key) for key in keys}) == 1

    def _eval_many(self, calls: Sequence[Call]) -> list[Reply]:
        """Every call in one pipeline (not a transaction: each script is atomic on its
        own); calls whose script the server lost (NOSCRIPT) run again after loading it."""
        replies: list[Any] = self._pipelined(calls)
        missing = lost(replies)
        if missing:
            try:
                for script in {calls[i][0] for i in missing}:
                    self.client.script_load(script.source)
            except FAILURES as exc:
                raise failure("loading scripts", exc) from exc
            for i, reply in zip(missing, self._pipelined([calls[i] for i in missing]), strict=True):
                replies[i] = reply
        return checked(calls, replies)

    def _pipelined(self, calls: Sequence[Call]) -> list[Any]:
        try:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                pipe.execute_command(*evalsha(call))
            return list(pipe.execute(raise_on_error=False))
        except FAILURES as exc:
            raise failure(f"running {len(calls)} scripts in one pipeline", exc) from exc

    def time(self) -> float:
        """The Redis server's clock, float seconds since the epoch (the funnels' clock)."""
        try:
            return server_seconds(self.client.time())
        except RedisError as exc:
            raise failure("TIME", exc) from exc

    def tickets(self, key: str, count: int = 20) -> list[tuple[str, float]]:
        """The first ``count`` reservation tickets booked on GCRA funnel ``key``, as
        (ticket, slot in float seconds since the epoch), earliest first."""
        try:
            booked = self.client.zrange(tickets_key(key), 0, count - 1, withscores=True)
        except RedisError as exc:
            raise failure(f"reading the tickets of {key!r}", exc) from exc
        return booked_slots(booked)

    def reset(self, key: str) -> None:
        try:
            self.client.delete(key, tickets_key(key))
        except RedisError as exc:
            raise failure(f"deleting {key!r}", exc) from exc


class _Lean:
    """The decision path's own connection, one per process, taken from the client's pool
    (so that closing the client closes it too): a decision is one command written and
    one reply read, without the client's per-command machinery (half of a decision's
    time on the client side, measured). One caller at a time uses it; a caller that
    finds it busy (another thread, a greenlet) goes through the client, as does a Redis
    Cluster client. A connection that fails is dropped and the command goes through the
    client, with its retries."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pool: Any = getattr(client, "connection_pool", None)
        self.lock = threading.Lock()
        self.held: tuple[int, Any] | None = None  # (pid, connection)

    def call(self, command: Sequence[Any]) -> Any:
        if self.pool is None or not self.lock.acquire(blocking=False):
            return self.client.execute_command(*command)
        try:
            connection = self._connection()
            try:
                connection.send_command(*command)
                return connection.read_response()
            except (RedisConnectionError, RedisTimeoutError, OSError):
                self.held = None
                connection.disconnect()
                self.pool.release(connection)
        finally:
            self.lock.release()
        return self.client.execute_command(*command)

    def _connection(self) -> Any:
        if self.held is not None and self.held[0] == os.getpid():
            return self.held[1]
        # first use, or a forked child (a prefork pool process): a connection of its own
        try:
            connection = self.pool.get_connection()
        except TypeError:  # redis-py < 5.3 wants a command name
            connection = self.pool.get_connection("EVALSHA")
        self.held = (os.getpid(), connection)
        return connection
