"""The broker transport's fetch on a real Redis, through kombu's own API (no worker):
the record it writes is kombu's, it takes in kombu's order, it never leaves a message
only in memory (a reply in flight at close, a lost connection, a record the broker
refuses), and stock kombu's ack, reject and restore work on what it recorded."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Producer
from kombu.transport import virtual

from celery_funnel._transport.channel import MARKERS_KEPT
from celery_funnel._transport.fetch import FETCH
from celery_funnel.testing import RedisServer
from celery_funnel.transport import Transport
from tests.polling import wait_for

pytestmark = pytest.mark.redis

STOCK = "redis"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(server.url) as connected:
        yield connected


def connect(url: str, transport: Any = Transport, **options: Any) -> Connection:
    return Connection(url, transport=transport, transport_options=options)


def publish(connection: Connection, queue: str, body: Any, **kwargs: Any) -> None:
    exchange = Exchange(queue, type="direct")
    declared = Queue(queue, exchange, routing_key=queue)
    with connection.channel() as channel:
        Producer(channel).publish(
            body, exchange=exchange, routing_key=queue, declare=[declared], **kwargs
        )


def take(connection: Connection, queue: str, no_ack: bool = False) -> Any:
    channel = connection.default_channel
    return Queue(queue, Exchange(queue), routing_key=queue, channel=channel).get(no_ack=no_ack)


def poll(channel: Any) -> None:
    """Send the channel's next poll command, as the consumer's event loop does."""
    channel.connection.cycle._register_BRPOP(channel)


def record_of(client: redis.Redis, tag: str, prefix: str = "") -> list[Any]:
    raw = client.hget(f"{prefix}unacked", tag)
    assert raw is not None, f"no un-acked record of {tag}"
    return list(json.loads(raw))


def test_the_record_is_kombus_own(server: RedisServer, client: redis.Redis) -> None:
    """The same message taken by kombu's transport and by ours leaves the same record:
    [the message as stored, its exchange, its routing key], indexed in unacked_index."""
    records = {}
    for name, transport in (("stock", STOCK), ("ours", Transport)):
        with connect(server.url, transport) as connection:
            publish(connection, "q", {"hello": "world", "n": [1, 2.5, None]}, priority=3)
            stored = json.loads(client.lindex("q", -1) or client.lindex("q\x06\x163", -1) or b"")
            message = take(connection, "q")
            assert message is not None
            record = record_of(client, message.delivery_tag)
            assert record[0] == stored
            assert client.zscore("unacked_index", message.delivery_tag) is not None
            records[name] = record
            message.ack()
    assert client.hlen("unacked") == 0
    for record in records.values():
        record[0]["properties"].pop("delivery_tag")
        record[0]["headers"] = record[0]["properties"]["delivery_info"] = None
    assert records["ours"] == records["stock"]


def test_a_body_that_is_not_first_is_read_whole(server: RedisServer, client: redis.Redis) -> None:
    """Messages of other producers (keys in another order, no spaces) are recorded too."""
    tag = "tag-1"
    message = {
        "properties": {"delivery_tag": tag, "delivery_info": {"exchange": "x", "routing_key": "q"},
                       "body_encoding": "base64", "priority": 0},
        "headers": {}, "content-type": "application/json", "content-encoding": "utf-8",
        "body": "eyJhIjogMX0=",
    }  # fmt: skip
    client.lpush("q", json.dumps(message, separators=(",", ":")))
    with connect(server.url) as connection:
        assert take(connection, "q") is not None
        assert record_of(client, tag) == [message, "x", "q"]


def test_a_body_with_escapes_is_skipped_right(server: RedisServer, client: redis.Redis) -> None:
    """A body holding escaped quotes and backslashes, and a header that looks like the
    routing: the record still names the message's own exchange and routing key."""
    body = 'say \\"hi\\" \\\\" , "properties": {"delivery_tag": "fake"}'
    with connect(server.url) as connection:
        publish(connection, "q", body, serializer="raw", content_type="text/plain",
                headers={"properties": {"delivery_tag": "fake"}})  # fmt: skip
        message = take(connection, "q")
        assert message is not None
        assert message.delivery_tag != "fake"
        assert record_of(client, message.delivery_tag)[1:] == ["q", "q"]
    assert message.body.decode() == body


@pytest.mark.parametrize(
    "body",
    ['say \\"hi\\" \\\\" , "properties": {"delivery_tag": "fake"}', "ends in a backslash \\",
     '\\\\\\" \\\\', ""],
)  # fmt: skip
def test_a_body_stored_with_escapes_is_skipped_right(
    server: RedisServer, client: redis.Redis, body: str
) -> None:
    """A body kept as a JSON string (a producer without base64, which kombu's
    publishes use): quotes after odd runs of backslashes are the body's, the quote
    after an even run ends it; the record is the message's own."""
    tag = "tag-1"
    message = {
        "body": body, "content-encoding": "utf-8", "content-type": "text/plain",
        "headers": {"properties": {"delivery_tag": "fake"}},
        "properties": {"delivery_tag": tag, "delivery_info": {"exchange": "x", "routing_key": "q"},
                       "priority": 0},
    }  # fmt: skip
    client.lpush("q", json.dumps(message))
    with connect(server.url) as connection:
        assert take(connection, "q") is not None
        assert record_of(client, tag) == [message, "x", "q"]


def test_no_ack_takes_without_a_record(server: RedisServer, client: redis.Redis) -> None:
    with connect(server.url) as connection:
        publish(connection, "q", {"n": 1})
        assert take(connection, "q", no_ack=True) is not None
    assert client.hlen("unacked") == 0
    assert client.llen("q") == 0


def test_stock_restore_ack_and_reject_work_on_our_records(
    server: RedisServer, client: redis.Redis
) -> None:
    """What our fetch recorded, kombu's own transport restores (after the visibility
    timeout), rejects back to the queue, and acks."""
    with connect(server.url) as ours:
        for n in range(3):
            publish(ours, "q", {"n": n})
        taken = [take(ours, "q") for _ in range(3)]
        ours.default_channel.do_restore = False  # a worker killed: nothing restored at close
    assert client.hlen("unacked") == 3
    assert client.llen("q") == 0
    with connect(server.url, STOCK, visibility_timeout=0) as stock:
        channel = stock.default_channel
        channel.qos.restore_by_tag(taken[0].delivery_tag, leftmost=True)  # a reject's
        channel.qos.ack(taken[1].delivery_tag)
        channel.qos.restore_visible(num=10, interval=1)  # the timeout: restored
    assert client.hlen("unacked") == 0
    assert client.zcard("unacked_index") == 0
    assert sorted(json.loads(m)["headers"].get("redelivered", False) for m in
                  client.lrange("q", 0, -1)) == [True, True]  # fmt: skip


def test_the_order_is_kombus(server: RedisServer, client: redis.Redis) -> None:
    """Priority steps first (0 before 3 before 6 before 9), then the queues in their
    round-robin turn, as kombu's BRPOP over the same keys."""
    with connect(server.url) as connection:
        for queue in ("a", "b"):
            for n, priority in enumerate((9, 0, 5, 0)):
                publish(connection, queue, {"q": queue, "n": n}, priority=priority)
        channel = connection.default_channel
        client.script_load(FETCH.source)
        for queue in ("a", "b"):
            channel.basic_consume(queue, False, lambda message: None, consumer_tag=queue)
        seen: list[tuple[int, str]] = []
        while len(seen) < 8:
            command = channel.fetch.command(channel._queue_cycle.consume(2), set())
            taken = channel.fetch.read(client.execute_command(*command))
            assert taken is not None
            channel._queue_cycle.rotate(taken.queue)
            seen.append((taken.payload["properties"]["priority"], taken.queue))
    # kombu's steps [0, 3, 6, 9]: priority 5 goes to step 3; queues alternate after every take
    assert [p for p, _ in seen] == [0, 0, 0, 0, 5, 5, 9, 9]
    queues = [q for _, q in seen]  # in turn, from where kombu's cycle starts
    assert queues == [queues[0], queues[1]] * 4
    assert set(queues) == {"a", "b"}


def test_a_reply_in_flight_at_close_is_restored(server: RedisServer, client: redis.Redis) -> None:
    """The poll connection sent the fetch and the channel closes before reading it (a
    warm shutdown): the message, recorded by then, goes back to its queue at once."""
    with connect(server.url) as connection:
        publish(connection, "q", {"n": 1})
        channel = connection.channel()
        channel.basic_consume("q", False, lambda message: None, consumer_tag="c")
        poll(channel)
        assert channel._in_poll
        channel.close()
    assert client.llen("q") == 1
    assert client.hlen("unacked") == 0


def test_a_lost_connection_leaves_the_message_recorded(
    server: RedisServer, client: redis.Redis
) -> None:
    """The connection breaks with the fetch's reply on its way: the message is in
    ``unacked``, where kombu restores it after the visibility timeout."""
    with connect(server.url) as connection:
        publish(connection, "q", {"n": 1})
        channel = connection.channel()
        channel.basic_consume("q", False, lambda message: None, consumer_tag="c")
        poll(channel)
        wait_for(lambda: client.hlen("unacked") == 1)  # taken and recorded by the broker
        channel.client.connection.disconnect()  # and the reply never arrives
        with pytest.raises(channel.connection_errors):
            channel._brpop_read()
    assert client.hlen("unacked") == 1
    assert client.llen("q") == 0


def test_noscript_after_a_restart_loads_it_again(server: RedisServer, client: redis.Redis) -> None:
    """The broker lost its scripts (a restart, SCRIPT FLUSH): the fetch that meets
    NOSCRIPT did not run, the next one sends the source, and nothing is taken twice."""
    delivered: list[Any] = []

    def drain(count: int) -> None:
        deadline = time.monotonic() + 20
        while len(delivered) < count:
            assert time.monotonic() < deadline, "not delivered"
            with contextlib.suppress(socket.timeout):
                connection.drain_events(timeout=0.2)

    with connect(server.url) as connection:
        channel = connection.channel()
        channel.basic_consume("q", False, delivered.append, consumer_tag="c")
        publish(connection, "q", {"n": 1})
        drain(1)
        assert channel.fetch.loaded
        client.script_flush()
        publish(connection, "q", {"n": 2})
        drain(2)
        assert client.script_exists(FETCH.sha) == [True]
        assert client.hlen("unacked") == 2
        assert client.llen("q") == 0
        assert [m.payload for m in delivered] == [{"n": 1}, {"n": 2}]


def test_a_record_refused_takes_nothing(server: RedisServer, client: redis.Redis) -> None:
    """A broker out of memory (noeviction) refuses the record: the message stays in its
    queue (kombu's transport would pop it, fail to record it, and lose it)."""
    with connect(server.url) as connection:
        publish(connection, "q", {"n": 1})
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", str(used))
        try:
            with pytest.raises(redis.ResponseError, match="OOM"):
                take(connection, "q")
        finally:
            client.config_set("maxmemory", "0")
    assert client.llen("q") == 1
    assert client.hlen("unacked") == 0


def test_markers_wake_a_waiting_consumer(server: RedisServer, client: redis.Redis) -> None:
    """An empty fetch clears the queue's markers and waits on them; our publish pushes
    one; the fetch that takes the message pops it."""
    with connect(server.url) as connection:
        channel = connection.channel()
        channel.basic_consume("q", False, lambda message: None, consumer_tag="c")
        marker = channel.fetch.marker("q")
        client.lpush(marker, 1, 1)  # stale ones
        poll(channel)
        with pytest.raises(virtual.Empty):
            channel._brpop_read()  # empty: the markers are cleared, wait on them next
        assert client.llen(marker) == 0
        assert not channel._ready
        publish(connection, "q", {"n": 1})
        assert client.llen(marker) == 1
        poll(channel)
        assert channel._polling == "wake"
        with pytest.raises(virtual.Empty):
            channel._brpop_read()  # woken by the marker
        assert channel._ready
        assert client.llen(marker) == 0


@pytest.mark.parametrize("prefix", ["", "pfx:"])
def test_markers_are_capped_where_no_fetch_pops_them(
    server: RedisServer, client: redis.Redis, prefix: str
) -> None:
    """Only kombu's own workers consume the queue (a rollback): our publishes keep at
    most MARKERS_KEPT markers, under the global key prefix."""
    with connect(server.url, global_keyprefix=prefix) as connection:
        for n in range(MARKERS_KEPT + 20):
            publish(connection, "q", {"n": n})
        marker = f"{prefix}{connection.default_channel.fetch.marker('q')}"
    assert client.llen(marker) == MARKERS_KEPT
    assert client.llen(f"{prefix}q") == MARKERS_KEPT + 20
    assert [key for key in client.scan_iter("*") if not key.startswith(prefix.encode())] == []
