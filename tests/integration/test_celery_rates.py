"""Rates written as Celery writes ``rate_limit`` ("2", 2, "0.5/s") pace a real worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_funnel._limiter.keys import limit_key, task_key
from celery_funnel._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for
from tests.redis_monitor import funnel_log, one_slot_each, started_early

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)


@pytest.fixture
def fresh(redis_client: redis.Redis) -> Iterator[list[Celery]]:
    """Apps a test makes, closed after it."""
    redis_client.flushall()
    apps: list[Celery] = []
    yield apps
    for app in apps:
        close_app(app)


@pytest.mark.parametrize(
    ("where", "rate", "per_second", "tasks"),
    [
        ("funnel_rate", "2", 2.0, 6),  # a FunnelTask's own rate, a bare count: per second
        ("funnel_rate", "0.5/s", 0.5, 3),  # a fractional count: 1 per 2 s
        ("funnel_limits", 2, 2.0, 6),  # a worker-wide limit on a plain task, a number
    ],
)
def test_celery_forms_pace_a_real_worker(
    fresh: list[Celery],
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    rate: str | int,
    per_second: float,
    tasks: int,
) -> None:
    if where == "funnel_rate":
        monkeypatch.setenv("FUNNEL_TEST_RATE", str(rate))  # proj.steady's funnel_rate
        app, name = make_app(redis_url, redis_url), "proj.steady"
        key = task_key("funnel:", name)
    else:
        app, name = make_app(redis_url, redis_url, funnel_limits={"proj.plain": rate}), "proj.plain"
        key = limit_key("funnel:", name)
    fresh.append(app)
    with (
        funnel_log(redis_url, key) as log,
        start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
    ):
        for i in range(tasks):
            app.tasks[name].delay(i)
        wait_for(lambda: len(runs(redis_url)) >= tasks, timeout=tasks / per_second + 60)
    starts = [run["at"] for run in runs(redis_url)]
    assert len(starts) == tasks  # each ran once
    # the pace read from the funnel's decisions on Redis's clock: one decision a run,
    # each one slot of the rate (1 / per_second), no run before its slot. Was: the
    # starts' rate within 5% (the worker's clock: a first start that load delays, or a
    # last one, moves it)
    writes = log.decisions(key)
    assert len(writes) == tasks, "one decision a run"
    slots = one_slot_each(writes, 1 / per_second, before=log.first_tat(key))
    assert started_early(starts, slots, DEFAULT_EARLY_SECONDS) == [], "a run before its slot"
