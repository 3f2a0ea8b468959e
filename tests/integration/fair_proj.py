"""A Celery project for the fair-share tests: ``make_fair_app``, and a module-level
``app`` (from FUNNEL_TEST_BROKER / FUNNEL_TEST_REDIS) for ``celery -A`` workers.

Each task shares one funnel between tenants (``funnel_fair_by="{tenant}"``) and records
every run (task, id, tenant, number, start time, priority) in the Redis list ``fair:runs``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_funnel import FunnelTask
from tests.broker_options import restore_options
from tests.crash import arm
from tests.integration.proj import make_app

RUNS = "fair:runs"
RATE = "20/s"


def queue_options(queue: str) -> dict[str, Any]:
    """Options of an app sending to ``queue``, a queue with priorities on AMQP brokers
    (0-9, larger first; kombu's Redis transport orders 0-9 without them)."""
    return {"queue": queue, "task_queue_max_priority": 10, "task_default_priority": 0}


def make_fair_app(broker_url: str, funnel_url: str, **conf: Any) -> Celery:
    """The project's app with its fair tasks: ``fair.shared`` (20/s shared by every
    tenant), ``fair.weighted`` (20/s, tenant ``heavy`` weighs 3), ``fair.priority``
    (20/s, one tenant), ``fair.many`` (FUNNEL_FAIR_RATE, default 50/s, for many
    tenants) and ``fair.plain`` (20/s, a plain FunnelTask: no tenants)."""
    app = make_app(broker_url, funnel_url, **{"queue": "fair", **conf})
    store = redis.Redis.from_url(funnel_url)

    def record(task: Any, tenant: str, n: int) -> None:
        priority = (task.request.delivery_info or {}).get("priority")
        state = (task.request.headers or {}).get("celery_funnel") or {}
        run = {
            "task": task.name, "id": task.request.id, "tenant": tenant, "n": n,
            "at": time.time(), "priority": priority,
            "stale": state.get("stale", 0), "requeues": state.get("requeues", 0),
        }  # fmt: skip
        store.rpush(RUNS, json.dumps(run))

    def fair_task(name: str, **options: Any) -> Any:
        options = {"funnel_rate": RATE, "funnel_fair_by": "{tenant}", **options}
        return app.task(shared=False, name=name, bind=True, base=FunnelTask, **options)

    @fair_task("fair.shared", ignore_result=True)
    def shared(self: Any, tenant: str, n: int = 0) -> None:
        record(self, tenant, n)

    @fair_task("fair.weighted", funnel_weights={"heavy": 3}, ignore_result=True)
    def weighted(self: Any, tenant: str, n: int = 0) -> None:
        record(self, tenant, n)

    @fair_task("fair.priority", ignore_result=True)
    def prioritized(self: Any, tenant: str, n: int = 0) -> None:
        record(self, tenant, n)

    @app.task(shared=False, name="fair.plain", bind=True, base=FunnelTask, funnel_rate=RATE)
    def plain(self: Any, tenant: str, n: int = 0) -> None:
        record(self, tenant, n)

    @fair_task("fair.many", funnel_rate=os.environ.get("FUNNEL_FAIR_RATE", "50/s"))
    def many(self: Any, tenant: str, n: int = 0) -> None:
        record(self, tenant, n)

    return app


def fair_runs(funnel_url: str, task: str) -> list[dict[str, Any]]:
    """Every run of ``task`` recorded so far, in start order."""
    with redis.Redis.from_url(funnel_url) as store:
        found = [json.loads(item) for item in store.lrange(RUNS, 0, -1)]
    return sorted((r for r in found if r["task"] == task), key=lambda r: r["at"])


if os.environ.get("FUNNEL_TEST_BROKER"):
    extra: dict[str, Any] = {}
    if os.environ.get("FUNNEL_TEST_VISIBILITY"):
        visibility = float(os.environ["FUNNEL_TEST_VISIBILITY"])
        extra["broker_transport_options"] = restore_options(visibility)
    app = make_fair_app(
        os.environ["FUNNEL_TEST_BROKER"], os.environ["FUNNEL_TEST_REDIS"],
        **queue_options(os.environ.get("FUNNEL_TEST_QUEUE", "fair")), **extra,
    )  # fmt: skip
    arm()
