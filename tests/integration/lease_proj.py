"""A Celery project for the concurrency-limit tests (``celery -A
tests.integration.lease_proj worker``), configured from FUNNEL_TEST_* environment
variables. Every run records its start and its end (epoch seconds, its worker) in the
Redis lists ``lease-starts`` and ``lease-ends``, from inside the task body."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore, Reject

from celery_funnel import FunnelTask, install
from tests.broker_options import restore_options
from tests.crash import arm

STARTS, ENDS = "lease-starts", "lease-ends"


def make_app(broker_url: str, funnel_url: str, queue: str = "leases", **conf: Any) -> Celery:
    """The app: funnels, results and run records in the funnels' Redis; tasks sent to
    and consumed from ``queue``."""
    app = Celery("lease_proj", broker=broker_url, backend=funnel_url.rsplit("/", 1)[0] + "/1")
    app.conf.update(
        funnel_redis_url=funnel_url,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=4,
        result_expires=600,
        **conf,
    )
    install(app)
    store = redis.Redis.from_url(funnel_url)

    def mark(task: Any, where: str, **more: Any) -> None:
        record = {"id": task.request.id, "task": task.name, "at": time.time(), **more}
        record["worker"] = task.request.hostname or socket.gethostname()
        store.rpush(where, json.dumps(record))

    def limited(name: str, **options: Any) -> Any:
        return app.task(shared=False, name=name, bind=True, base=FunnelTask, **options)

    def body(task: Any, seconds: float, **more: Any) -> None:
        mark(task, STARTS, **more)
        time.sleep(seconds)
        mark(task, ENDS, **more)

    @limited("leases.three", funnel_concurrency=3)
    def three(self: Any, seconds: float) -> None:
        body(self, seconds)

    @limited("leases.per_key", funnel_concurrency=2, funnel_key="{customer}")
    def per_key(self: Any, customer: str, seconds: float, until: str = "") -> None:
        if not until:
            body(self, seconds, key=customer)
            return
        # holds its seat until the test sets the key ``until`` (at most 120 s)
        mark(self, STARTS, key=customer)
        deadline = time.monotonic() + 120.0
        while not store.exists(until) and time.monotonic() < deadline:
            time.sleep(0.05)
        mark(self, ENDS, key=customer)

    @limited("leases.both", funnel_concurrency=2, funnel_rate="5/s")
    def both(self: Any, seconds: float) -> None:
        body(self, seconds)

    @app.task(shared=False, name="leases.plain", bind=True)  # limited by funnel_limits
    def plain(self: Any, seconds: float) -> None:
        body(self, seconds)

    @limited("leases.ends", funnel_concurrency=1, max_retries=1)
    def ends(self: Any, how: str) -> str:
        mark(self, STARTS, how=how)
        if how == "fail":
            raise ValueError("the task failed")
        if how == "retry" and not self.request.retries:
            raise self.retry(countdown=0.1)
        if how == "reject":
            raise Reject("rejected", requeue=False)
        if how == "ignore":
            raise Ignore()
        if how in ("sleep", "soft", "hard"):
            time.sleep(10)
        if how == "long":  # until revoked (terminate): outlives any CLI call a test makes
            time.sleep(120)
        mark(self, ENDS, how=how)
        return how

    return app


if os.environ.get("FUNNEL_TEST_BROKER"):
    extra: dict[str, Any] = {}
    if os.environ.get("FUNNEL_TEST_VISIBILITY"):
        visibility = float(os.environ["FUNNEL_TEST_VISIBILITY"])
        extra["broker_transport_options"] = restore_options(visibility)
        extra["task_acks_late"] = True
    if os.environ.get("FUNNEL_TEST_LEASE_TTL"):
        extra["funnel_lease_ttl"] = float(os.environ["FUNNEL_TEST_LEASE_TTL"])
    if os.environ.get("FUNNEL_TEST_LIMITS"):
        extra["funnel_limits"] = json.loads(os.environ["FUNNEL_TEST_LIMITS"])
    app = make_app(
        os.environ["FUNNEL_TEST_BROKER"],
        os.environ["FUNNEL_TEST_REDIS"],
        os.environ.get("FUNNEL_TEST_QUEUE", "leases"),
        **extra,
    )
    arm()
