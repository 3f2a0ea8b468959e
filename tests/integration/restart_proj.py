"""A Celery project for the restart tests: every way a task waits on the funnels' Redis
(a rate, a worker-wide rate, a concurrency slot, a fair-share turn), with the runs
recorded in a Redis of their own (``FUNNEL_TEST_STORE``), so that the funnels' Redis
can be killed and started again alone.

``make_restart_app`` for producers; a module-level ``app`` (FUNNEL_TEST_* variables) for
``celery -A tests.integration.restart_proj worker``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_funnel import FunnelTask, install

RUNS = "restart:runs"


def make_restart_app(
    broker_url: str, funnel_url: str, store_url: str, *, fair: bool = True, **conf: Any
) -> Celery:
    """``restart.rate`` (FUNNEL_TEST_RATE), ``restart.plain`` (limited by
    ``funnel_limits`` only), ``restart.slot`` (2 at once, 0.3 s each) and, with
    ``fair``, ``restart.fair`` (FUNNEL_TEST_RATE shared by tenants: a worker where no
    task may be parked refuses to start with it)."""
    app = Celery("restart_proj", broker=broker_url, backend=store_url.rsplit("/", 1)[0] + "/1")
    app.conf.update(
        funnel_redis_url=funnel_url, task_default_queue="restart", task_ignore_result=True,
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False, **conf,
    )  # fmt: skip
    install(app)
    store = redis.Redis.from_url(store_url)
    rate = os.environ.get("FUNNEL_TEST_RATE", "20/s")

    def record(task: Any, n: int) -> None:
        state = (task.request.headers or {}).get("celery_funnel") or {}
        run = {"id": task.request.id, "name": task.name, "n": n, "at": time.time(), **state}
        store.rpush(RUNS, json.dumps(run))

    def funnel_task(name: str, **options: Any) -> Any:
        return app.task(shared=False, name=name, bind=True, base=FunnelTask, **options)

    @funnel_task("restart.rate", funnel_rate=rate)
    def limited(self: Any, n: int) -> None:
        record(self, n)

    @app.task(shared=False, name="restart.plain", bind=True)
    def plain(self: Any, n: int) -> None:
        record(self, n)

    @funnel_task("restart.slot", funnel_concurrency=2)
    def slot(self: Any, n: int) -> None:
        time.sleep(0.3)  # the run holds its slot this long
        record(self, n)

    if fair:

        @funnel_task("restart.fair", funnel_rate=rate, funnel_fair_by="{tenant}")
        def shared(self: Any, n: int, tenant: str = "a") -> None:
            record(self, n)

    return app


def restart_runs(store_url: str) -> list[dict[str, Any]]:
    """Every run recorded so far."""
    with redis.Redis.from_url(store_url) as store:
        return [json.loads(item) for item in store.lrange(RUNS, 0, -1)]


if os.environ.get("FUNNEL_TEST_BROKER"):
    _limits = os.environ.get("FUNNEL_TEST_LIMITS")
    app = make_restart_app(
        os.environ["FUNNEL_TEST_BROKER"],
        os.environ["FUNNEL_TEST_REDIS"],
        os.environ["FUNNEL_TEST_STORE"],
        funnel_limits=json.loads(_limits) if _limits else {},
        funnel_park=os.environ.get("FUNNEL_TEST_PARK", "auto"),
        fair=os.environ.get("FUNNEL_TEST_FAIR", "1") == "1",
    )
