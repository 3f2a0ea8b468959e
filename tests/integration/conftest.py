"""Fixtures for the integration tests: what the package's signals and metrics report."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import _set_task_join_will_block
from kombu.asynchronous import set_event_loop
from kombu.connection import Connection
from kombu.entity import Queue
from prometheus_client import CollectorRegistry

from celery_funnel import prometheus, signals
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.conftest import SERVERS, ServerPool
from tests.integration.proj import close_app, make_app

ROOT = str(Path(__file__).resolve().parents[2])


class Recorder:
    """Every signal of the package, as (signal name, kwargs) pairs."""

    SIGNALS = (
        "task_admitted",
        "task_deferred",
        "task_refused",
        "backend_error",
        "backend_recovered",
        "task_collapsed",
        "task_dropped",
    )

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def receiver(self, name: str) -> Any:
        def receive(sender: Any = None, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            with self._lock:
                self.got.append((name, {"sender": sender, **kwargs}))

        return receive

    def of(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [kwargs for got, kwargs in self.got if got == name]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    receivers = [(getattr(signals, n), recorder.receiver(n)) for n in Recorder.SIGNALS]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    yield recorder
    for signal, receiver in receivers:
        signal.disconnect(receiver)


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = prometheus.enable(registry)
    yield registry
    metrics.disconnect()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A metric's value in ``registry`` (0 when never set)."""
    return registry.get_sample_value(name, labels) or 0.0


def nothing_left(broker_url: str, funnel_url: str, queue: str = "proj") -> None:
    """Once every worker stopped (a warm shutdown hands back what it held): no message
    of ``queue`` waits in the broker (queued, or delivered and never acknowledged) and
    none in the funnels' Redis (parked, debounced): nothing can run any more, so the
    runs recorded by now are all there will be."""
    if broker_url.startswith("redis"):
        with redis.Redis.from_url(broker_url) as broker:
            # kombu's Redis transport: a list per queue and priority, one unacked hash
            lists = [k for k in broker.scan_iter(f"{queue}*") if broker.type(k) == b"list"]
            assert [broker.llen(k) for k in lists] == [0] * len(lists), lists
            assert broker.hlen("unacked") == 0, unacked(broker)
    else:
        with Connection(broker_url) as connection:
            declared = Queue(queue, channel=connection.channel()).queue_declare(passive=True)
            assert declared.message_count == 0
    with redis.Redis.from_url(funnel_url) as client:
        assert ParkStore(client, "funnel:").count() == 0


def unacked(broker: redis.Redis) -> list[str]:
    """What kombu's Redis transport holds un-acked: each message's task, id, routing
    key and how long before the broker's clock it was delivered (seconds)."""
    now = float("{}.{:06d}".format(*broker.time()))
    held = []
    for tag, entry in broker.hgetall("unacked").items():
        raw, _, routing_key = json.loads(entry)
        headers = raw.get("headers", {})
        since = broker.zscore("unacked_index", tag)
        age = "?" if since is None else f"{now - since:.1f} s"
        held.append(f"{headers.get('task')}[{headers.get('id')}] to {routing_key}, {age} ago")
    return held


@pytest.fixture
def standalone_url(server_pool: ServerPool) -> str:
    """One standalone private server, flushed: a broker and run store that the test's
    faults and topologies leave alone."""
    url = server_pool.url(next(iter(SERVERS)))
    with redis.Redis.from_url(url) as client:
        client.flushall()
    return url


@pytest.fixture
def project_app(redis_url: str, redis_client: redis.Redis) -> Iterator[Celery]:
    """The test project's app (``tests.integration.proj``) on one Redis, emptied for the
    test: its broker, funnels and results."""
    redis_client.flushall()
    app = make_app(redis_url, redis_url)
    yield app
    close_app(app)


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    """A broker of the test's own (a private redis-server, stopped after the test)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def store_url() -> Iterator[str]:
    """A Redis of the test's own for run records (a private redis-server): no fault of
    the test touches it."""
    with RedisServer() as server:
        yield server.url


@pytest.fixture(autouse=True)
def _fresh_worker_state() -> Iterator[None]:
    """An in-process worker leaves kombu's event loop (whose timer no longer runs) and
    the "inside a worker" flag behind; older kombu (5.3) hands that hub to the next
    in-process worker, whose ETA tasks then never fire."""
    yield
    _set_task_join_will_block(False)
    set_event_loop(None)


AMQP = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _rabbitmq_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def amqp_url() -> str:
    if not _rabbitmq_up():
        if os.environ.get("CI"):
            pytest.fail("RabbitMQ is not listening on 127.0.0.1:5672 and CI is set")
        pytest.skip("RabbitMQ is not listening on 127.0.0.1:5672")
    return AMQP


@contextmanager
def project_on(
    url: str, funnel_url: str, prefix: str = "proj", env: dict[str, str] | None = None,
    **conf: Any,
) -> Iterator[tuple[Celery, CeleryWorkers]]:  # fmt: skip
    """An app of the test project (``conf``: more of its settings) and two of its
    workers (``env``: more of their environment), started, on a queue of their own at
    the broker ``url``; the queue is deleted after (RabbitMQ's outlives its workers)."""
    queue = f"{prefix}-{time.time_ns()}"
    env = {
        "FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": funnel_url, "FUNNEL_TEST_QUEUE": queue,
        **(env or {}),
    }  # fmt: skip
    app = make_app(url, funnel_url, queue=queue, **conf)
    try:
        with CeleryWorkers(
            "tests.integration.proj", 2, env, "-c", "2", "-Q", queue, cwd=ROOT,
            prefix=f"{queue}-w",
        ) as started:  # fmt: skip
            started.wait_ready()
            yield app, started
    finally:
        if not url.startswith("redis"):
            with app.connection_for_write() as connection:
                Queue(queue, channel=connection.channel()).delete()
        close_app(app)


@pytest.fixture(params=["redis", "rabbitmq"])
def on_broker(
    request: pytest.FixtureRequest, broker: RedisServer, standalone_url: str
) -> Iterator[Celery]:
    """An app of the test project and two of its workers, started, on a queue of their
    own, on a Redis broker (``broker``) or on RabbitMQ (skipped where it is not running,
    unless CI is set); the queue is deleted after."""
    url = broker.url if request.param == "redis" else request.getfixturevalue("amqp_url")
    with project_on(url, standalone_url) as (app, _):
        yield app
