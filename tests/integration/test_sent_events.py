"""A task the gate publishes again is sent once, as Celery's events and Flower count it
(issue 55, item 2), on a Redis broker and on RabbitMQ: each re-publish sent another
``task-sent`` event from the worker (46 for 12 tasks on Redis, 191 for 42 on RabbitMQ,
up to 7 for one task), so Flower counted the task sent again after it was received, and
its prefetched gauge (``flower_worker_prefetched_tasks``, Flower's own code here fed by
the events) never came back to 0: the late ``task-sent`` gave the task an ETA, and
Flower stops counting a task with an ETA. Parking published nothing through Celery;
the re-publish now publishes the message it captures, as a release does. And a task's
``task-received`` comes before its first ``funnel-deferred`` (Celery buffers its task
events on the worker's event loop; the gate sent its own at once, ahead of them)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.entity import Queue

from celery_funnel._config.observe import EVENT
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.proj import close_app, make_app, runs
from tests.integration.test_observability import ROOT, Events
from tests.polling import wait_for

pytest.importorskip("flower")
pytestmark = [pytest.mark.redis, pytest.mark.slow]

# parking off, and a countdown of at most 0.5 s: a long wait is published again, often
CONF: dict[str, Any] = {"funnel_max_countdown": 0.5, "task_send_sent_event": True}
SLOW, LIMITED = 4, 12  # proj.slow: 1 per 2 s (waits up to 6 s); proj.limited: 10/s


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "rabbitmq":
        yield request.getfixturevalue("amqp_url")  # skipped without it, unless CI is set
        return
    with RedisServer() as server:
        yield server.url


def test_a_republished_task_is_sent_once_and_received_before_deferred(
    broker_url: str, standalone_url: str
) -> None:
    from flower.events import EventsState  # type: ignore[import-untyped]

    queue = f"sent-{time.time_ns()}"
    env = {
        "FUNNEL_TEST_BROKER": broker_url, "FUNNEL_TEST_REDIS": standalone_url,
        "FUNNEL_TEST_QUEUE": queue, "FUNNEL_TEST_PARK": "0",
        "FUNNEL_TEST_CONF": json.dumps(CONF),
    }  # fmt: skip
    app = make_app(broker_url, standalone_url, queue=queue, task_ignore_result=True, **CONF)
    flower = EventsState()
    try:
        with Events(app, flower.event) as events, CeleryWorkers(
            "tests.integration.proj", 2, env, "-c", "2", "-E", "-Q", queue, cwd=ROOT,
            prefix=f"{queue}-w",
        ):  # fmt: skip
            ids = [app.tasks["proj.slow"].delay(n).id for n in range(SLOW)]
            ids += [app.tasks["proj.limited"].delay(n).id for n in range(LIMITED)]
            wait_for(lambda: len(runs(standalone_url)) == len(ids), 90)
            succeeded = lambda: {e["uuid"] for e in events.of("task-succeeded")}  # noqa: E731
            wait_for(lambda: succeeded() >= set(ids), 30)
            seen = list(events.seen)
    finally:
        if not broker_url.startswith("redis"):
            with app.connection_for_write() as connection:
                Queue(queue, channel=connection.channel()).delete()
        close_app(app)

    deferrals = [e for e in seen if e["type"] == EVENT]
    ways = Counter(e["how"] for e in deferrals)
    assert ways["republished"] >= 5, ways  # the waits went back to the broker, often
    sent = Counter(e["uuid"] for e in seen if e["type"] == "task-sent")
    assert sent == dict.fromkeys(ids, 1), "each task sent once, by its producer"
    senders = {e["hostname"] for e in seen if e["type"] == "task-sent"}
    assert not any(queue in host for host in senders), f"no worker sends it: {senders}"
    received = Counter(e["uuid"] for e in seen if e["type"] == "task-received")
    assert received == dict.fromkeys(ids, 1)

    # the order the docs' table gives: received, then deferred (each of a task's events
    # comes from the worker that received it, on one connection, in the order sent)
    order = [(e["type"], e["uuid"]) for e in seen if e["type"] in ("task-received", EVENT)]
    for task_id in {e["uuid"] for e in deferrals}:
        first = order.index(("task-received", task_id))
        assert first < order.index((EVENT, task_id)), f"{task_id}: deferred before received"

    # Flower's prefetched gauge, summed over the workers, back to 0 (per worker it may
    # not be: a task received by one worker may start on the other, docs/observability.md)
    metric = flower.metrics.number_of_prefetched_tasks
    prefetched = {
        labels: child._value.get()
        for labels, child in metric._metrics.items()
        if queue in labels[0]
    }
    assert prefetched, "Flower counted the tasks"
    assert sum(prefetched.values()) == 0, prefetched
