"""``AsyncRedisFunnel``: the funnels of ``RedisFunnel`` on a ``redis.asyncio`` client.

The same scripts on the same keys, so an asyncio web app, a script and Celery workers
share one funnel; the same methods and answers, awaited. Each method is ``Funnel``'s own,
run through ``_awaited.awaited``: the strategies build the call and decode the reply as
they do for ``RedisFunnel``; only the round trip is awaited.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import ConfigurationError
from ..guard import limit_method
from ..keys import tickets_key
from ..scripts import Arg, Call, Reply, Script
from ._awaited import awaited
from ._clients import async_client_from_url
from .base import Funnel
from .redis import (
    DEFAULT_TIMEOUT_SECONDS,
    FAILURES,
    as_reply,
    booked_slots,
    checked,
    evalsha,
    failure,
    lost,
    server_seconds,
)

__all__ = ["AsyncRedisFunnel"]

P = ParamSpec("P")
T = TypeVar("T")
# below redis.asyncio's default max_connections (100), which refuses calls beyond it
DEFAULT_MAX_IN_FLIGHT = 50


def _awaitable(
    method: Callable[Concatenate[Funnel, P], T],
) -> Callable[Concatenate[AsyncRedisFunnel, P], Coroutine[Any, Any, T]]:
    """``Funnel``'s ``method`` as a coroutine method of ``AsyncRedisFunnel``."""

    async def run(self: AsyncRedisFunnel, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(lambda store: method(store, *args, **kwargs))

    functools.update_wrapper(run, method)
    run.__qualname__ = f"AsyncRedisFunnel.{method.__name__}"
    return run


class AsyncRedisFunnel:
    """Funnels kept in Redis, for asyncio code: ``RedisFunnel``'s methods, awaited.

    ``decide``, ``throttle``, ``throttle_many``, ``water_level``, ``reserve``, ``reserve_all``,
    ``hold``, ``settle``, ``settle_all``, ``align``, ``align_all``, ``adapt``, ``fixed_window``,
    ``sliding_log`` and ``sliding_window`` take the same arguments and give the same
    answers (``Decision``, ``Reservation``) as ``Funnel``'s; each is one round trip
    (EVALSHA of a script loaded once; NOSCRIPT after a ``SCRIPT FLUSH`` or a failover
    loads it again and retries). The Redis server's
    ``TIME`` is the clock. A ``RedisFunnel`` on the same Redis shares every funnel.

    Raises (every method): ``ConfigurationError`` for bad arguments, before anything is
    sent; ``BackendError`` when Redis fails (unreachable, timing out, loading);
    ``BackendConfigurationError`` when it refuses the work as configured (ACL, read-only
    replica, OOM, WRONGTYPE).

    Args:
        client: a ``redis.asyncio`` ``Redis`` or ``RedisCluster`` client, or a Sentinel
            master client (``redis.asyncio.sentinel``).
        max_in_flight: round trips in flight at once; more callers wait their turn.
            redis.asyncio's pools refuse a call beyond ``max_connections`` (100 by
            default) with "Too many connections": keep this below it.
    """

    def __init__(self, client: Any, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        if not inspect.iscoroutinefunction(getattr(client, "execute_command", None)):
            raise ConfigurationError(
                f"AsyncRedisFunnel needs a redis.asyncio client, got {client!r}"
                f" (a blocking redis-py client goes with RedisFunnel)"
            )
        if (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or max_in_flight < 1
        ):
            raise ConfigurationError(
                f"max_in_flight must be an integer >= 1, got {max_in_flight!r}"
            )
        self.client = client
        self._lean = _Lean(client)
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._first, self._warm = asyncio.Lock(), False
        self._sentinels: list[Any] = []  # clients of Sentinels this funnel made (from_url)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> AsyncRedisFunnel:
        """An ``AsyncRedisFunnel`` on a new ``redis.asyncio`` client for ``url``, read as
        ``RedisFunnel.from_url`` reads it (``redis://``, ``rediss://``, ``unix://``,
        ``redis+cluster://``, ``redis+sentinel://``). Socket timeouts default to 2
        seconds; ``options`` go to the client (``max_in_flight`` to the funnel). Close
        it with ``aclose()``.

        Raises:
            ConfigurationError: when the URL cannot be parsed.
        """
        in_flight = options.pop("max_in_flight", DEFAULT_MAX_IN_FLIGHT)
        options.setdefault("socket_timeout", DEFAULT_TIMEOUT_SECONDS)
        options.setdefault("socket_connect_timeout", DEFAULT_TIMEOUT_SECONDS)
        funnel = cls(async_client_from_url(url, **options), max_in_flight=in_flight)
        manager = getattr(getattr(funnel.client, "connection_pool", None), "sentinel_manager", None)
        funnel._sentinels = list(getattr(manager, "sentinels", ()))
        return funnel

    async def _run(self, decision: Callable[[Funnel], T]) -> T:
        """What ``decision`` (code written for a ``Funnel``) answers on these funnels."""
        return await awaited(decision, self._run_many)

    async def _run_many(self, calls: Sequence[Call]) -> list[Reply]:
        if not self._warm:
            # redis-py's asyncio RedisCluster (8.1) fails some of the first calls made at
            # once on a new client ("'NoneType' object has no attribute 'writelines'": up
            # to 8 of 150, measured), none once one call went through: the first goes alone
            async with self._first:
                if not self._warm:
                    replies = await self._send(calls)
                    self._warm = True
                    return replies
        async with self._in_flight:
            return await self._send(calls)

    async def _send(self, calls: Sequence[Call]) -> list[Reply]:
        if len(calls) == 1:
            return [await self._eval(*calls[0])]
        return await self._eval_many(calls)

    async def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        command = evalsha((script, keys, args))
        try:
            try:
                reply = await self._lean.call(command)
            except NoScriptError:
                await self.client.script_load(script.source)
                reply = await self._lean.call(command)
        except FAILURES as exc:
            raise failure(f"running {script.name}.lua", exc) from exc
        return as_reply(reply)

    async def _eval_many(self, calls: Sequence[Call]) -> list[Reply]:
        """Every call in one pipeline, as ``RedisFunnel._eval_many`` sends them."""
        replies = await self._pipelined(calls)
        missing = lost(replies)
        if missing:
            try:
                for script in {calls[i][0] for i in missing}:
                    await self.client.script_load(script.source)
            except FAILURES as exc:
                raise failure("loading scripts", exc) from exc
            again = await self._pipelined([calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return checked(calls, replies)

    async def _pipelined(self, calls: Sequence[Call]) -> list[Any]:
        try:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                pipe.execute_command(*evalsha(call))
            return list(await pipe.execute(raise_on_error=False))
        except FAILURES as exc:
            raise failure(f"running {len(calls)} scripts in one pipeline", exc) from exc

    decide = _awaitable(Funnel.decide)
    throttle = _awaitable(Funnel.throttle)
    throttle_many = _awaitable(Funnel.throttle_many)
    water_level = _awaitable(Funnel.water_level)
    reserve = _awaitable(Funnel.reserve)
    reserve_all = _awaitable(Funnel.reserve_all)
    hold = _awaitable(Funnel.hold)
    settle = _awaitable(Funnel.settle)
    settle_all = _awaitable(Funnel.settle_all)
    align = _awaitable(Funnel.align)
    align_all = _awaitable(Funnel.align_all)
    adapt = _awaitable(Funnel.adapt)
    fixed_window = _awaitable(Funnel.fixed_window)
    sliding_log = _awaitable(Funnel.sliding_log)
    sliding_window = _awaitable(Funnel.sliding_window)
    limit = limit_method

    async def time(self) -> float:
        """The Redis server's clock, float seconds since the epoch (the funnels' clock)."""
        try:
            return server_seconds(await self.client.time())
        except RedisError as exc:
            raise failure("TIME", exc) from exc

    async def tickets(self, key: str, count: int = 20) -> list[tuple[str, float]]:
        """The first ``count`` reservation tickets booked on GCRA funnel ``key``, as
        (ticket, slot in float seconds since the epoch), earliest first."""
        try:
            booked = await self.client.zrange(tickets_key(key), 0, count - 1, withscores=True)
        except RedisError as exc:
            raise failure(f"reading the tickets of {key!r}", exc) from exc
        return booked_slots(booked)

    async def reset(self, key: str) -> None:
        """Forget funnel ``key`` and everything kept beside it (tickets, counters)."""
        try:
            await self.client.delete(key, tickets_key(key))
        except RedisError as exc:
            raise failure(f"deleting {key!r}", exc) from exc

    async def aclose(self) -> None:
        """Close the client and its connections (with ``from_url``'s Sentinel client,
        its connections to the Sentinels too: nothing else holds them)."""
        await _close(self.client)
        for sentinel in self._sentinels:
            await _close(sentinel)

    async def __aenter__(self) -> AsyncRedisFunnel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _close(client: Any) -> None:
    close = getattr(client, "aclose", None) or client.close  # redis-py < 5.0.1: close()
    await close()


class _Lean:
    """The decision path's own connection, taken from the client's pool (closing the
    client closes it): a decision is one command written and one reply read, without
    the client's per-command machinery (measured: 61 µs an awaited EVALSHA through the
    client, 41 on its own connection), as ``RedisFunnel``'s ``_Lean``. One coroutine at
    a time uses it; the others, and a Redis Cluster client (no one pool), go through the
    client. redis-py disconnects a connection whose call failed or was cancelled (a
    reply may be left unread); it is connected again before its next command, and a
    call that failed on it goes through the client, with its retries."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pool: Any = getattr(client, "connection_pool", None)
        self.connection: Any = None
        self.busy = False

    async def call(self, command: Sequence[Any]) -> Any:
        if self.pool is None or self.busy:
            return await self.client.execute_command(*command)
        self.busy = True
        try:
            if self.connection is None:
                self.connection = await self._take()
            try:
                if not self.connection.is_connected:
                    # its own connect(): a Sentinel's asks where the master is now (the
                    # reconnect inside send_command goes back to the old address)
                    await self.connection.connect()
                await self.connection.send_command(*command)
                return await self.connection.read_response()
            except (RedisConnectionError, RedisTimeoutError, OSError):
                pass  # disconnected by redis-py; the client retries as configured
        finally:
            self.busy = False
        return await self.client.execute_command(*command)

    async def _take(self) -> Any:
        try:
            return await self.pool.get_connection()
        except TypeError:  # redis-py < 5.3 wants a command name
            return await self.pool.get_connection("EVALSHA")
