"""A Celery project for the tests of waiting on the broker's own Redis (issue 42): one
Redis serving as broker (db 1) and funnels' Redis (db 2), with or without an append-only
file; the runs are recorded in a Redis of their own (``FUNNEL_TEST_STORE``), so that
the shared one can be killed alone.

``make_broker_app`` for producers; a module-level ``app`` (FUNNEL_TEST_* variables) for
``celery -A tests.integration.broker_proj worker``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_funnel import FunnelTask, install

RUNS = "broker:runs"
QUEUE = "bp"


def make_broker_app(
    broker_url: str, funnel_url: str, store_url: str, queue: str = QUEUE, *,
    parks: bool = True, **conf: Any,
) -> Celery:  # fmt: skip
    """``bp.seat`` (3 at once, 0.2 s each), ``bp.paced`` (5/s), ``bp.fair`` (20/s
    shared by tenants), ``bp.debounced`` (1 s per key), ``bp.limited`` (20/s) and
    ``bp.plain`` (Celery's own ``rate_limit``, 10/s per worker: no funnel); without
    ``parks`` (nothing may be parked), not the two that refuse to start then."""
    app = Celery("broker_proj", broker=broker_url, backend=store_url.rsplit("/", 1)[0] + "/1")
    app.conf.update(
        funnel_redis_url=funnel_url, task_default_queue=queue, task_ignore_result=True,
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False, **conf,
    )  # fmt: skip
    install(app)
    store = redis.Redis.from_url(store_url)

    def record(task: Any, n: int, began: float, **more: Any) -> None:
        state = (task.request.headers or {}).get("celery_funnel") or {}
        run = {
            "id": task.request.id, "name": task.name, "n": n, "at": began, "end": time.time(),
            "requeues": state.get("requeues", 0), "worker": task.request.hostname, **more,
        }  # fmt: skip
        store.rpush(RUNS, json.dumps(run))

    def funnel_task(name: str, **options: Any) -> Any:
        return app.task(shared=False, name=name, bind=True, base=FunnelTask, **options)

    @funnel_task("bp.seat", funnel_concurrency=3)
    def seat(self: Any, n: int, seconds: float = 0.2) -> None:
        began = time.time()
        time.sleep(seconds)
        record(self, n, began)

    @funnel_task("bp.paced", funnel_rate="5/s")
    def paced(self: Any, n: int) -> None:
        record(self, n, time.time())

    if parks:

        @funnel_task("bp.fair", funnel_rate="20/s", funnel_fair_by="{tenant}")
        def fair(self: Any, n: int, tenant: str = "a") -> None:
            record(self, n, time.time(), tenant=tenant)

        @funnel_task("bp.debounced", funnel_debounce=1.0, funnel_key="{key}")
        def debounced(self: Any, n: int, key: str = "k") -> None:
            record(self, n, time.time(), key=key)

    @funnel_task("bp.limited", funnel_rate="20/s")
    def limited(self: Any, n: int) -> None:
        record(self, n, time.time())

    @app.task(shared=False, name="bp.plain", bind=True, rate_limit="10/s")
    def plain(self: Any, n: int) -> None:
        record(self, n, time.time())

    return app


def send_many(app: Celery, name: str, count: int, first: int = 0, **kwargs: Any) -> list[str]:
    """Send ``count`` runs of task ``name`` (args ``first`` and on, ``kwargs`` each)
    on one producer; their ids."""
    task = app.tasks[name]
    with app.producer_or_acquire() as producer:
        return [
            task.apply_async((n,), kwargs, producer=producer).id
            for n in range(first, first + count)
        ]


def broker_runs(store_url: str, name: str | None = None) -> list[dict[str, Any]]:
    """Every run recorded so far (of task ``name``), in start order."""
    with redis.Redis.from_url(store_url) as store:
        found = [json.loads(item) for item in store.lrange(RUNS, 0, -1)]
    return sorted((r for r in found if name in (None, r["name"])), key=lambda r: r["at"])


if os.environ.get("FUNNEL_TEST_BROKER"):
    # RabbitMQ tests (``test_rabbitmq_waiting``) add a queue of their own, late acks
    # and a short seat lease
    _extra: dict[str, Any] = json.loads(os.environ.get("FUNNEL_TEST_CONF", "{}"))
    app = make_broker_app(
        os.environ["FUNNEL_TEST_BROKER"],
        os.environ["FUNNEL_TEST_REDIS"],
        os.environ["FUNNEL_TEST_STORE"],
        os.environ.get("FUNNEL_TEST_QUEUE", QUEUE),
        parks=os.environ.get("FUNNEL_TEST_PARKS", "1") == "1",
        **_extra,
    )
