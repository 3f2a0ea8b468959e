"""A plain Celery project (no funnel) for the broker transport's tests:
``celery -A tests.integration.transport_proj worker``, configured from the environment
(``TransportConf``), or ``make_transport_app`` in the test's own process (a producer).

Its one task records each run (task id, argument, worker, queue, priority, whether the
broker gave it again) with one RPUSH to a store no fault touches.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery
from kombu.entity import Queue

from tests.crash import arm

RUNS = "transport:runs"
ENV = "TRANSPORT_TEST_CONF"
OURS = "celery_funnel.transport:Transport"
OURS_SENTINEL = "celery_funnel.transport:SentinelTransport"


@dataclass(frozen=True)
class TransportConf:
    """The broker, which transport (``ours``: celery_funnel's; else kombu's), the queues,
    more broker transport options, and the store of run records."""

    broker: str
    store: str
    ours: bool = True
    queues: tuple[str, ...] = ("t",)
    options: dict[str, Any] = field(default_factory=dict)
    acks_late: bool = False
    prefetch: int = 4

    def env(self) -> dict[str, str]:
        return {ENV: json.dumps(dataclasses.asdict(self))}

    @classmethod
    def from_env(cls, environ: dict[str, str]) -> TransportConf:
        fields = json.loads(environ[ENV])
        return cls(**{**fields, "queues": tuple(fields["queues"])})


def make_transport_app(conf: TransportConf) -> Celery:
    """The app of ``conf`` (see the module)."""
    app = Celery("transport", broker=conf.broker)
    sentinel = conf.broker.startswith("sentinel")
    app.conf.update(
        task_queues=[Queue(name, routing_key=name) for name in conf.queues],
        task_default_queue=conf.queues[0],
        task_ignore_result=True,
        task_acks_late=conf.acks_late,
        worker_prefetch_multiplier=conf.prefetch,
        broker_transport_options=conf.options,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    if conf.ours:
        app.conf.broker_transport = OURS_SENTINEL if sentinel else OURS
    store = redis.Redis.from_url(conf.store)

    @app.task(shared=False, name="transport.record", bind=True)
    def record(self: Any, n: int = 0, seconds: float = 0.0) -> int:
        info = self.request.delivery_info or {}
        time.sleep(seconds)
        run = {
            "id": self.request.id, "n": n, "worker": self.request.hostname,
            "queue": info.get("routing_key"), "priority": info.get("priority"),
            "redelivered": bool(info.get("redelivered")),
        }  # fmt: skip
        store.rpush(RUNS, json.dumps(run))
        return n

    return app


def runs(store_url: str) -> list[dict[str, Any]]:
    """Every run recorded so far, in the order they ran."""
    with redis.Redis.from_url(store_url) as store:
        return [json.loads(item) for item in store.lrange(RUNS, 0, -1)]


def counts(store_url: str) -> Counter[str]:
    """How many times each task id ran."""
    return Counter(run["id"] for run in runs(store_url))


if ENV in os.environ:
    app = make_transport_app(TransportConf.from_env(dict(os.environ)))
    arm()
