"""The Celery project of the toy limiter kind's test (``celery -A
tests.integration.toy_proj worker``): one task limited by ``toy_gap`` (``toy_kind``).
The worker's import of this module registers the kind first (FUNNEL_TEST_* set); the
test process registers it in a fixture. Each run records its id and start time in
the Redis list ``runs`` (``proj.runs`` reads it)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_funnel import FunnelTask
from tests.integration import toy_kind
from tests.integration.proj import RUNS, new_app

TASK = "toy.spaced"
RATE = "2/s"  # toy_gap: one start every 0.5 s


def make_app(broker_url: str, funnel_url: str, queue: str = "toy") -> Celery:
    """The app: funnels and run records in ``funnel_url``'s Redis, tasks on ``queue``."""
    app = new_app("toy_proj", broker_url, funnel_url, queue, funnel_url, task_ignore_result=True)
    store = redis.Redis.from_url(funnel_url)

    @app.task(
        shared=False, name=TASK, bind=True, base=FunnelTask,
        funnel_rate=RATE, funnel_strategy=toy_kind.NAME,
    )  # fmt: skip
    def spaced(self: Any, n: int) -> int:
        store.rpush(RUNS, json.dumps({"id": self.request.id, "args": [n], "at": time.time()}))
        return n

    return app


if os.environ.get("FUNNEL_TEST_BROKER"):
    toy_kind.register_kind()  # the worker: before its tasks, as a kind's import does
    app = make_app(os.environ["FUNNEL_TEST_BROKER"], os.environ["FUNNEL_TEST_REDIS"])
