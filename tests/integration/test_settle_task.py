"""``FunnelTask.funnel_settle`` and ``funnel_feedback`` in a real worker: what a run
was charged at admission (the gate's charges) becomes what it said it used; settling
twice settles relative to the first; a direct call settles nothing; bad names and
window strategies fail the task with a clear error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from prometheus_client import CollectorRegistry

from celery_funnel import ConfigurationError, FunnelTask, RedisFunnel
from celery_funnel._config.runtime import runtime_for
from tests.integration.conftest import sample
from tests.integration.proj import close_app, new_app

pytestmark = [pytest.mark.redis]
ONE_REDIS = True

TOKENS = {"name": "tokens", "rate": "1/s", "capacity": 10_000, "cost": 250}
REQUESTS = {"name": "requests", "rate": "100/s", "capacity": 100}


@pytest.fixture
def app(redis_url: str, redis_client: redis.Redis) -> Iterator[Celery]:
    redis_client.flushall()
    app = new_app("settle_app", redis_url, redis_url, "settle", redis_url)
    n = uuid.uuid4().hex[:8]  # Celery warns of a task name registered twice

    @app.task(
        bind=True, base=FunnelTask, funnel_limits=[REQUESTS, TOKENS], name=f"llm.{n}", shared=False
    )
    def llm(self: Any, first: int, second: int | None) -> bool:
        self.funnel_settle(tokens=first)
        if second is not None:
            self.funnel_settle(tokens=second)  # relative to the first
        return True

    @app.task(bind=True, base=FunnelTask, funnel_limits=[TOKENS], name=f"unknown.{n}", shared=False)
    def unknown(self: Any) -> bool:
        return bool(self.funnel_settle(tokenz=1))

    @app.task(bind=True, base=FunnelTask, funnel_rate="1/s", funnel_capacity=100,
              funnel_strategy="fixed_window", name=f"window.{n}", shared=False)  # fmt: skip
    def window(self: Any) -> bool:
        return bool(self.funnel_settle(1))

    @app.task(
        bind=True, base=FunnelTask, funnel_limits=[REQUESTS, TOKENS], name=f"fed.{n}", shared=False
    )
    def fed(self: Any, headers: dict[str, str]) -> list[str]:
        return sorted(self.funnel_feedback(headers).quotas)

    @app.task(bind=True, base=FunnelTask, funnel_rate="1/s", funnel_capacity=1000,
              funnel_cost=100, name=f"own.{n}", shared=False)  # fmt: skip
    def own(self: Any, used: int) -> bool:
        return bool(self.funnel_settle(used))  # the task's own funnel, unnamed

    app.conf.test_names = {t.split(".")[0]: t for t in (f"{x}.{n}" for x in NAMES)}
    yield app
    close_app(app)


NAMES = ("llm", "unknown", "window", "fed", "own")


def task(app: Celery, name: str) -> Any:
    return app.tasks[app.conf.test_names[name]]


def held(app: Celery, name: str, index: int) -> float:
    """Seconds of charges funnel ``index`` of task ``name`` holds now (a peek)."""
    runtime = runtime_for(app)
    funnel = runtime.funnel
    assert isinstance(funnel, RedisFunnel)
    limits = task(app, name)._funnel_limits()
    key = runtime.task_key(task(app, name).name, "", index if len(limits) > 1 else None)
    limit = limits[index]
    return funnel.throttle(
        key, limit.capacity - 1, limit.rate.count, limit.rate.period, 0
    ).reset_after


def test_a_run_settles_its_named_funnels_and_a_second_settle_is_relative(
    app: Celery, registry: CollectorRegistry
) -> None:
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        assert task(app, "llm").delay(120, None).get(timeout=20)
        # 1 token/s: the funnel holds 120 s of tokens (the estimate 250 settled to 120)
        assert 118 < held(app, "llm", 1) <= 120
        assert task(app, "llm").delay(100, 40).get(timeout=20)  # 250 -> 100 -> 40
        assert 158 < held(app, "llm", 1) <= 160
        assert held(app, "llm", 0) <= 0.02  # requests: charged 1 each, never settled
    # the metric names the limit: given back 130, then 150 and 60
    labels = {"funnel": task(app, "llm").name, "limit": "tokens", "direction": "back"}
    assert sample(registry, "celery_funnel_settled_units_total", **labels) == 130 + 150 + 60


def test_a_task_settles_its_own_funnel_by_position(app: Celery) -> None:
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        assert task(app, "own").delay(30).get(timeout=20)
    assert 28 < held(app, "own", 0) <= 30  # 100 charged, 30 settled, at 1 unit/s


def test_a_direct_call_settles_nothing(app: Celery) -> None:
    assert task(app, "llm")(5, None)
    assert held(app, "llm", 1) == 0.0


def test_a_bad_name_and_a_window_strategy_fail_the_task_clearly(app: Celery) -> None:
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        with pytest.raises(ConfigurationError, match="no limit named 'tokenz'"):
            task(app, "unknown").delay().get(timeout=20)
        with pytest.raises(ConfigurationError, match="only 'gcra' funnels can be settled"):
            task(app, "window").delay().get(timeout=20)


def test_feedback_brings_the_named_funnels_in_line(app: Celery) -> None:
    headers = {
        "x-ratelimit-remaining-tokens": "9000", "x-ratelimit-reset-tokens": "6m0s",
        "x-ratelimit-remaining-requests": "100", "x-ratelimit-reset-requests": "0s",
        "x-ratelimit-remaining-images": "3", "x-ratelimit-reset-images": "1s",
    }  # fmt: skip
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        assert task(app, "fed").delay(headers).get(timeout=20) == ["images", "requests", "tokens"]
    # 9000 of our 10 000 tokens remain upstream: 1000 s of them are spent here
    assert 990 < held(app, "fed", 1) <= 1000  # (less the seconds since)
    assert held(app, "fed", 0) <= 0.02  # 100 of 100 requests remain: left alone
