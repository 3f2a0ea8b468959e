"""The funnel's Redis dies under a real worker: funnel_on_backend_error decides, and
nothing is lost. One WARNING when the outage starts, one when it ends."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from prometheus_client import CollectorRegistry

from celery_funnel.testing import RedisServer
from tests.integration.conftest import Recorder, sample
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)


@pytest.fixture
def funnel_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def outage_app(redis_url: str, funnel_server: RedisServer) -> Iterator[Callable[..., Celery]]:
    """Makes apps whose funnels live on ``funnel_server``; closed after the test, when
    its results are gone too (they would reconnect to unsubscribe)."""
    apps: list[Celery] = []

    def make(**conf: Any) -> Celery:
        with redis.Redis.from_url(redis_url) as client:
            client.flushall()
        apps.append(make_app(redis_url, funnel_server.url, store_url=redis_url, **conf))
        return apps[-1]

    yield make
    for app in apps:
        close_app(app)


@pytest.mark.parametrize(
    ("task", "conf"),
    [("proj.limited", {}), ("proj.plain", {"funnel_limits": {"proj.plain": "10/s"}})],
    ids=["FunnelTask", "funnel_limits"],
)
def test_defer_waits_out_the_outage_and_loses_nothing(
    redis_url: str,
    funnel_server: RedisServer,
    outage_app: Callable[..., Celery],
    caplog: pytest.LogCaptureFixture,
    recorder: Recorder,
    registry: CollectorRegistry,
    task: str,
    conf: dict[str, Any],
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_funnel")
    # no results: the run records tell what ran, and no pub/sub outlives the test
    app = outage_app(task_ignore_result=True, **conf)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        funnel_server.kill()
        for i in range(3):
            app.tasks[task].delay(i)
        wait_for(lambda: "funnel backend failed" in caplog.text)
        assert runs(redis_url) == [], "nothing ran unthrottled"
        assert sample(registry, "celery_funnel_backend_up") == 0
        funnel_server.start()
        wait_for(lambda: len(runs(redis_url)) >= 3, timeout=30)
    assert sorted(r["args"][0] for r in runs(redis_url)) == [0, 1, 2], "each ran once"
    messages = [record.getMessage() for record in caplog.records]
    assert sum(m.startswith("celery-funnel: the funnel backend failed") for m in messages) == 1
    assert sum(m.startswith("celery-funnel: the funnel backend answers") for m in messages) == 1
    # signals: every failed call, the first one marked; one recovery; metrics follow
    errors = recorder.of("backend_error")
    assert [e["first"] for e in errors].count(True) == 1
    assert all(e["policy"] == "defer" for e in errors)
    (recovered,) = recorder.of("backend_recovered")
    assert recovered["downtime"] > 0
    assert sample(registry, "celery_funnel_backend_errors_total") == len(errors)
    assert sample(registry, "celery_funnel_backend_up") == 1


def test_allow_runs_tasks_unthrottled(
    redis_url: str, funnel_server: RedisServer, outage_app: Callable[..., Celery]
) -> None:
    app = outage_app(funnel_on_backend_error="allow", task_ignore_result=True)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        funnel_server.kill()
        for i in range(3):
            app.tasks["proj.limited"].delay(i)
        wait_for(lambda: len(runs(redis_url)) >= 3)
    assert all(r["deferrals"] == 0 for r in runs(redis_url))


def test_raise_fails_the_task(
    redis_url: str, funnel_server: RedisServer, outage_app: Callable[..., Celery]
) -> None:
    app = outage_app(funnel_on_backend_error="raise")
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        funnel_server.kill()
        result = app.tasks["proj.limited"].delay(1)
        with pytest.raises(Exception, match="Redis failed") as info:
            result.get(timeout=20)
        assert type(info.value).__name__ == "BackendError"
    assert runs(redis_url) == []
