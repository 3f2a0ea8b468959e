"""The fault matrix's reader of a broker's append-only file (``tests.faults.aof``), on
the files real redis-server binaries write (6.x: one file; 7.x: a directory of parts)
through kombu's own Redis transport, a broker SIGKILLed and started again between."""

from __future__ import annotations

import contextlib

import pytest
import redis
from kombu.connection import Connection

from celery_funnel.testing import RedisServer
from celery_funnel.testing._redis import find_redis_servers
from celery_funnel.transport import Transport
from tests.faults.aof import Fate, fates, read_commands

pytestmark = pytest.mark.redis
AOF = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.mark.parametrize("binary", find_redis_servers())
def test_a_message_popped_as_the_broker_died_is_told_from_one_delivered(binary: str) -> None:
    with RedisServer(binary, None, *AOF) as server:
        client = redis.Redis.from_url(server.url)
        connection = Connection(server.url)
        queue = connection.SimpleQueue("q")
        for task_id in ("delivered", "popped", "queued"):
            queue.put({"n": task_id}, headers={"id": task_id})
        queue.get(timeout=5)  # kombu records it in "unacked" (never acked)
        client.rpop("q")  # a pop whose reader died before it recorded the message
        server.kill()  # the kombu channel never closed: nothing restored
        with contextlib.suppress(Exception):
            connection.release()
        server.start()
        client.set("after", "the restart")  # the first write after a start: a SELECT
        client.close()
        got = fates(read_commands(server.directory), {"q"})
    assert got == {
        "delivered": Fate(pushed=1, popped=1, unacked=1),
        "popped": Fate(pushed=1, popped=1, lost_at_a_pop=True, writes_before_death=0),
        "queued": Fate(pushed=1),
    }


@pytest.mark.parametrize("binary", find_redis_servers())
def test_a_message_given_again_unacked_is_told_from_one_sent_again(binary: str) -> None:
    with RedisServer(binary, None, *AOF) as server:
        connection = Connection(server.url)
        queue = connection.SimpleQueue("q")
        queue.put({"n": 1}, headers={"id": "restored"})
        queue.get(timeout=5).requeue()  # kombu's restore, as of a dead worker's message
        queue.get(timeout=5).ack()
        queue.put({"n": 2}, headers={"id": "sent again"})  # a new message, a new tag
        queue.put({"n": 3}, headers={"id": "sent again"})
        queue.close()
        connection.release()
        got = fates(read_commands(server.directory), {"q"})
    assert got["restored"] == Fate(pushed=2, popped=2, unacked=2, restored=1)
    assert got["sent again"] == Fate(pushed=2)


@pytest.mark.parametrize("binary", find_redis_servers())
def test_the_transports_fetch_is_read_as_recorded_at_its_pop(binary: str) -> None:
    """celery_funnel.transport's fetch writes ``unacked`` and trims the message off in
    one script (the file holds its effects): taken, never lost at a pop, though the
    broker dies right after; a stock pop beside it still is."""
    with RedisServer(binary, None, *AOF) as server:
        client = redis.Redis.from_url(server.url)
        connection = Connection(server.url, transport=Transport)
        queue = connection.SimpleQueue("q")
        for task_id in ("fetched", "popped"):
            queue.put({"n": task_id}, headers={"id": task_id})
        queue.get(timeout=5)  # the fetch: recorded in the same call (never acked)
        client.rpop("q")  # a stock pop whose reader died before it recorded the message
        server.kill()
        with contextlib.suppress(Exception):
            connection.release()
        server.start()
        client.set("after", "the restart")
        client.close()
        got = fates(read_commands(server.directory), {"q"})
    assert got == {
        "fetched": Fate(pushed=1, popped=1, unacked=1),
        "popped": Fate(pushed=1, popped=1, lost_at_a_pop=True, writes_before_death=0),
    }
