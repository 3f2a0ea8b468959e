"""The fetch against a small Python model, over random sequences of publish, fetch, ack,
reject, restore and a consumer's crash, on a real Redis through kombu's own API: after
every step the broker holds what the model holds (each queue list in order, the
un-acked records), and every message not acked is in exactly one place: one queue list
or ``unacked``, never only in a consumer's memory."""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Producer
from kombu.utils.encoding import bytes_to_str

from celery_funnel.testing import RedisServer
from celery_funnel.transport import Transport

pytestmark = pytest.mark.redis

QUEUES = ("a", "b")
# kombu before 5.4 restores a message to its queue's own list, whatever its priority
RESTORED_BY_PRIORITY = tuple(kombu.VERSION[:2]) >= (5, 4)
STEPS = (0, 3, 6, 9)  # kombu's priority steps: each a list of its own (step 0: the queue)


class FetchModel(RuleBasedStateMachine):
    """The model: per (queue, step) a deque (left: newest, right: taken next), the
    un-acked records (tag -> message id), and what the consumer holds in memory."""

    url = ""

    @initialize()
    def connect(self) -> None:
        self.client = redis.Redis.from_url(self.url)
        self.client.flushall()
        self.connection = Connection(
            self.url, transport=Transport, transport_options={"visibility_timeout": 0}
        )
        self.channel = self.connection.channel()
        self.lists: dict[tuple[str, int], deque[int]] = {
            (q, s): deque() for q in QUEUES for s in STEPS
        }  # fmt: skip
        self.unacked: dict[str, int] = {}
        self.memory: set[str] = set()  # tags the consumer holds, un-acked
        self.acked: set[int] = set()  # acked, or taken without acks: gone for good
        self.homes: dict[int, tuple[str, int]] = {}  # where each message was published
        self.published = 0

    def teardown(self) -> None:
        if hasattr(self, "connection"):
            self.channel.do_restore = False  # a model's consumer: nothing restored at close
            self.connection.close()
            self.client.close()

    def key(self, queue: str, step: int) -> str:
        return queue if step == 0 else f"{queue}\x06\x16{step}"

    @rule(queue=st.sampled_from(QUEUES), step=st.sampled_from(STEPS))
    def publish(self, queue: str, step: int) -> None:
        exchange = Exchange(queue, type="direct")
        Producer(self.channel).publish(
            {"id": self.published}, exchange=exchange, routing_key=queue, priority=step,
            declare=[Queue(queue, exchange, routing_key=queue)],
        )  # fmt: skip
        self.lists[(queue, step)].appendleft(self.published)
        self.homes[self.published] = (queue, step)
        self.published += 1

    @rule(order=st.permutations(QUEUES), no_ack=st.booleans())
    def fetch(self, order: list[str], no_ack: bool) -> None:
        command = self.channel.fetch.command(order, set(order) if no_ack else set())
        taken = self.channel.fetch.read(self.client.execute_command(*command))
        expected = next(
            ((q, s) for s in STEPS for q in order if self.lists[(q, s)]), None
        )  # fmt: skip
        if expected is None:
            assert taken is None
            return
        assert taken is not None
        message = self.lists[expected].pop()
        assert taken.queue == expected[0]
        assert self.body_id(taken.payload) == message
        assert taken.recorded is not no_ack
        if no_ack:
            self.acked.add(message)
        else:
            self.unacked[taken.tag] = message
            self.memory.add(taken.tag)

    def body_id(self, payload: dict[str, Any]) -> int:
        message = self.channel.Message(payload, channel=self.channel)
        return int(message.decode()["id"])

    @precondition(lambda self: self.memory)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        tag = data.draw(st.sampled_from(sorted(self.memory)))
        self.channel.qos.ack(tag)
        self.memory.discard(tag)
        self.acked.add(self.unacked.pop(tag))

    @precondition(lambda self: self.memory)
    @rule(data=st.data(), requeue=st.booleans())
    def reject(self, data: st.DataObject, requeue: bool) -> None:
        tag = data.draw(st.sampled_from(sorted(self.memory)))
        self.memory.discard(tag)
        message = self.unacked.pop(tag)
        if requeue:  # kombu's reject puts it at the back of its queue (LPUSH)
            self.channel.qos.restore_by_tag(tag, leftmost=True)
            self.lists[self.home(message)].appendleft(message)
        else:
            self.channel.qos.reject(tag, requeue=False)
            self.acked.add(message)

    @rule()
    def crash(self) -> None:
        """The consumer dies: what it held in memory is gone, its records stay."""
        self.memory.clear()

    @precondition(lambda self: self.unacked and not self.memory)
    @rule()
    def restore(self) -> None:
        """kombu's restore after the visibility timeout (0 here): every record goes back
        to the front of its queue (RPUSH), oldest first as its index has them."""
        order = [bytes_to_str(tag) for tag in self.client.zrange("unacked_index", 0, -1)]
        self.channel.qos.restore_visible(num=1000, interval=1)
        for tag in reversed(order):
            message = self.unacked.pop(tag)
            self.lists[self.home(message)].append(message)

    def home(self, message: int) -> tuple[str, int]:
        """The list kombu restores ``message`` to: its priority's (its queue's own
        before kombu 5.4)."""
        queue, step = self.homes[message]
        return (queue, step if RESTORED_BY_PRIORITY else 0)

    @invariant()
    def broker_holds_what_the_model_holds(self) -> None:
        if not hasattr(self, "client"):
            return
        for (queue, step), expected in self.lists.items():
            raw = self.client.lrange(self.key(queue, step), 0, -1)
            assert [self.stored_id(item) for item in raw] == list(expected)
        records = {bytes_to_str(tag) for tag in self.client.hkeys("unacked")}
        assert records == set(self.unacked)
        assert self.client.zcard("unacked_index") == len(self.unacked)

    @invariant()
    def each_message_is_in_exactly_one_place(self) -> None:
        if not hasattr(self, "client"):
            return
        places = Counter([m for items in self.lists.values() for m in items])
        places.update(self.unacked.values())
        pending = set(range(self.published)) - self.acked
        assert set(places) == pending
        assert all(count == 1 for count in places.values())

    def stored_id(self, item: Any) -> int:
        return self.body_id(json.loads(item))


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


def test_the_fetch_keeps_every_message_in_one_place(server: RedisServer) -> None:
    FetchModel.url = server.url
    FetchModel.TestCase.settings = settings(
        max_examples=60, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )  # fmt: skip
    FetchModel.TestCase().runTest()
