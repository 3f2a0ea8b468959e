"""The Celery project of the toy concurrency variant's test (``celery -A
tests.integration.toy_variant_proj worker``): one plain task under a ``funnel_limits``
entry of one seat whose variant is ``toy_queue_cap`` (``toy_variant``). The worker's
import of this module registers the variant first (FUNNEL_TEST_* set). Each run counts
the runs going at its start (the Redis list ``toy-peaks``), records its id (``runs``),
and waits until the test lets it end (the key ``toy-go``)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from tests.integration import toy_variant
from tests.integration.proj import RUNS, new_app

TASK = "toyq.job"
RUNNING, PEAKS, GO = "toy-running", "toy-peaks", "toy-go"
LIMITS = {"toyq.*": {"concurrency": 1, "variant": toy_variant.NAME}}


def make_app(broker_url: str, funnel_url: str, queue: str = "toyq") -> Celery:
    """The app: funnels, results and run records in ``funnel_url``'s Redis, tasks on
    ``queue``."""
    app = new_app(
        "toy_variant_proj", broker_url, funnel_url, queue, funnel_url, funnel_limits=LIMITS
    )
    store = redis.Redis.from_url(funnel_url)

    @app.task(shared=False, name=TASK, bind=True)
    def job(self: Any, n: int) -> int:
        store.rpush(PEAKS, store.incr(RUNNING))
        store.rpush(RUNS, json.dumps({"id": self.request.id, "args": [n], "at": time.time()}))
        deadline = time.monotonic() + 60  # the test lets it end long before
        while not store.exists(GO) and time.monotonic() < deadline:
            time.sleep(0.05)
        store.decr(RUNNING)
        return n

    return app


if os.environ.get("FUNNEL_TEST_BROKER"):
    toy_variant.register_variant()  # the worker: before its tasks, as a variant's import does
    app = make_app(os.environ["FUNNEL_TEST_BROKER"], os.environ["FUNNEL_TEST_REDIS"])
