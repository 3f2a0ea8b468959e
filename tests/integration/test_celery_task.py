"""FunnelTask on a real in-process worker, a real Redis broker and a real funnel."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group
from celery.contrib.testing.worker import start_worker

from tests.integration.proj import make_app, runs

pytestmark = pytest.mark.redis


@pytest.fixture
def celery_app(redis_url: str, redis_client: redis.Redis) -> Iterator[Celery]:
    redis_client.flushall()
    app = make_app(redis_url, redis_url)
    yield app
    # results hold a pub/sub consumer: let them go while the server is still up
    gc.collect()
    app.close()


@pytest.fixture
def worker(celery_app: Celery) -> Iterator[Any]:
    with start_worker(
        celery_app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=10
    ) as w:
        yield w


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_throttled_tasks_run_once_each_at_the_funnel_rate(
    celery_app: Celery, worker: Any, redis_url: str
) -> None:
    results = [celery_app.tasks["proj.limited"].delay(i) for i in range(8)]
    assert sorted(r.get(timeout=20) for r in results) == list(range(8))
    recorded = runs(redis_url)
    assert sorted(r["args"][0] for r in recorded) == list(range(8))  # each ran once
    starts = sorted(r["at"] for r in recorded)
    # 10/s, capacity 1: 8 starts take at least 0.7 s (minus timer jitter)
    assert starts[-1] - starts[0] >= 0.65
    deferred = [r for r in recorded if r["deferrals"]]
    assert deferred, "some tasks were deferred"
    assert all(r["retries"] == 0 for r in recorded)
    assert all(r["deferrals"] == 1 for r in deferred), "reservation: one deferral each"
