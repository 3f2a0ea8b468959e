"""AsyncRedisFunnel: the same scripts, answers and failures as RedisFunnel, awaited."""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest
import redis
import redis.asyncio

from celery_funnel import (
    AsyncRedisFunnel,
    BackendConfigurationError,
    BackendError,
    ConfigurationError,
    Funnel,
    RedisFunnel,
    Shape,
)
from celery_funnel.testing import RedisServer
from tests.conftest import ASYNC, ServerPool
from tests.tables import T0, TABLES, answer_row, play, rows

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("table", list(TABLES))
async def test_every_store_answers_every_table_alike(
    any_funnel: Funnel | AsyncRedisFunnel, key: str, table: str
) -> None:
    """One conformance table over MemoryFunnel, RedisFunnel and AsyncRedisFunnel (each
    Redis and a Cluster): redis-cell's GCRA table among them, replayed exactly."""
    for label, method, kwargs, expected in rows(table):
        answer = play(any_funnel, key, method, kwargs)
        if inspect.isawaitable(answer):
            answer = await answer
        assert answer_row(answer) == expected, label


async def test_many_decisions_in_one_pipeline(async_funnel: AsyncRedisFunnel, key: str) -> None:
    shapes = [Shape(f"{key}:{i}", 0, 1, 60) for i in range(3)]
    first = await async_funnel.throttle_many(shapes, now=T0)
    again = await async_funnel.throttle_many(shapes[:2], now=T0 + 1)
    assert [d.limited for d in first] == [False] * 3
    assert [(d.limited, d.retry_after) for d in again] == [(True, 59.0)] * 2


async def test_scripts_are_loaded_again_after_script_flush(
    async_funnel: AsyncRedisFunnel, key: str
) -> None:
    await async_funnel.throttle(key, 5, 1, 1)
    await async_funnel.client.script_flush()
    assert (await async_funnel.throttle(key, 5, 1, 1)).remaining == 4
    await async_funnel.client.script_flush()
    batch = [Shape(f"{{{key}}}:a", 0, 1, 1), Shape(f"{{{key}}}:b", 0, 1, 1)]
    assert [d.granted for d in await async_funnel.throttle_many(batch)] == [1, 1]


async def test_funnels_are_shared_with_a_blocking_redis_funnel(
    async_funnel: AsyncRedisFunnel, server_pool: ServerPool, any_backend_id: str, key: str
) -> None:
    blocking = RedisFunnel.from_url(server_pool.funnel_url(any_backend_id.removeprefix(ASYNC)))
    try:
        await async_funnel.throttle(key, 1, 1, 60)
        assert blocking.throttle(key, 1, 1, 60).remaining == 0
        assert (await async_funnel.throttle(key, 1, 1, 60)).limited
    finally:
        blocking.client.close()


async def test_more_callers_than_connections_wait_their_turn(
    async_funnel: AsyncRedisFunnel, key: str
) -> None:
    """redis.asyncio's pools refuse a call beyond 100 connections ("Too many
    connections"): the funnel keeps at most max_in_flight round trips in flight."""
    calls = [async_funnel.throttle(key, 299, 1, 60) for _ in range(300)]
    decisions = await asyncio.gather(*calls)
    assert sorted(d.remaining for d in decisions) == list(range(300))


async def test_time_tickets_and_reset(async_funnel: AsyncRedisFunnel, key: str) -> None:
    assert abs(await async_funnel.time() - time.time()) < 5
    await async_funnel.reserve(key, 0, 1, 60, ticket="first")
    booked = await async_funnel.reserve(key, 0, 1, 60, ticket="second")
    [(ticket, slot)] = await async_funnel.tickets(key)
    assert ticket == "second"
    assert slot == pytest.approx(await async_funnel.time() + booked.delay, abs=1)
    await async_funnel.reset(key)
    assert await async_funnel.tickets(key) == []
    assert not (await async_funnel.throttle(key, 0, 1, 60)).limited


async def test_bad_arguments_are_refused_before_redis(async_funnel: AsyncRedisFunnel) -> None:
    with pytest.raises(ConfigurationError, match="key"):
        await async_funnel.throttle("", 0, 1, 1)
    with pytest.raises(ConfigurationError, match="count"):
        await async_funnel.fixed_window("k", 0, 1)


async def test_a_key_of_another_type_is_a_configuration_fault(
    async_funnel: AsyncRedisFunnel, key: str
) -> None:
    await async_funnel.client.rpush(key, "not a funnel")
    with pytest.raises(BackendConfigurationError, match="WRONGTYPE") as info:
        await async_funnel.sliding_log(key, 1, 1)
    assert isinstance(info.value.__cause__, redis.RedisError)
    await async_funnel.client.delete(key)


@pytest.mark.redis
async def test_an_unreachable_redis_raises_backend_error_quickly() -> None:
    with RedisServer() as server:
        funnel = AsyncRedisFunnel.from_url(server.url, socket_timeout=0.5)
        assert not (await funnel.throttle("k", 0, 1, 1)).limited
        server.kill()
        start = time.monotonic()
        with pytest.raises(BackendError, match="gcra") as info:
            await funnel.throttle("k", 0, 1, 1)
        assert isinstance(info.value.__cause__, redis.RedisError)
        assert time.monotonic() - start < 5
        with pytest.raises(BackendError):
            await funnel.throttle_many([Shape("a", 0, 1, 1), Shape("b", 0, 1, 1)])
        await funnel.aclose()


@pytest.mark.redis
async def test_decisions_go_on_after_redis_restarts_on_the_same_port() -> None:
    """The decision path keeps a connection of its own: when the server goes away and
    comes back, the next decision reconnects instead of failing on a dead socket."""
    server = RedisServer().start()
    try:
        funnel = AsyncRedisFunnel.from_url(server.url)
        assert not (await funnel.throttle("k", 5, 10, 1)).limited
        server.kill()
        with pytest.raises(BackendError):
            await funnel.throttle("k", 5, 10, 1)
        server.start()
        assert (await funnel.throttle("k", 5, 10, 1)).remaining == 5, "a fresh funnel"
        await funnel.aclose()
    finally:
        server.stop()


async def test_a_cancelled_call_leaves_no_reply_for_the_next(
    async_funnel: AsyncRedisFunnel, key: str
) -> None:
    """A call cancelled while Redis holds its reply back (CLIENT PAUSE) must not hand
    that reply to the next call on the same connection."""
    if not hasattr(async_funnel.client, "connection_pool"):
        pytest.skip("a Cluster client has no decision connection of its own")
    await async_funnel.throttle(f"{key}:warm", 0, 1, 1)  # the decision connection, taken
    await async_funnel.client.client_pause(300)  # on another connection of the pool
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(async_funnel.throttle(key, 9, 1, 60), 0.05)
    decision = await async_funnel.throttle(f"{key}:other", 0, 1, 10)
    assert (decision.limit, decision.reset_after) == (1, 10.0)  # its own reply: T = 10 s


async def test_a_blocking_client_or_a_bad_url_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"redis\.asyncio"):
        AsyncRedisFunnel(redis.Redis())
    with pytest.raises(ConfigurationError, match="ftp://x"):
        AsyncRedisFunnel.from_url("ftp://x")
    client = redis.asyncio.Redis()
    assert AsyncRedisFunnel(client).client is client
    with pytest.raises(ConfigurationError, match="max_in_flight"):
        AsyncRedisFunnel(client, max_in_flight=0)
    await client.aclose()


def test_methods_keep_the_names_and_documentation_of_funnel() -> None:
    assert AsyncRedisFunnel.reserve.__doc__ == Funnel.reserve.__doc__
    assert inspect.iscoroutinefunction(AsyncRedisFunnel.throttle)
    assert AsyncRedisFunnel.sliding_window.__qualname__ == "AsyncRedisFunnel.sliding_window"
