"""The adaptive rate in a real worker: a run's 429 (``funnel_feedback(status=429)``)
lowers its adaptive funnel's rate in Redis; the worker's live thread reads it into the
gate's table, and the gate admits at that rate; a success after ``every`` climbs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_funnel import FunnelTask, control
from celery_funnel._config.runtime import runtime_for
from celery_funnel._shared.live import live_for
from tests.integration.proj import close_app, new_app
from tests.polling import wait_for

pytestmark = [pytest.mark.redis]
ONE_REDIS = True

# 20/s; the first 429 drops it to 1/s (20 x 0.05), a success adds 1/s (the min)
RULE = {"min": "1/s", "decrease": 0.05, "every": 0.5}


@pytest.fixture
def app(redis_url: str, redis_client: redis.Redis) -> Iterator[Celery]:
    redis_client.flushall()
    app = new_app("adaptive_app", redis_url, redis_url, "adaptive", redis_url)
    name = f"adapt.{uuid.uuid4().hex[:8]}"  # Celery warns of a task name registered twice

    @app.task(bind=True, base=FunnelTask, name=name, shared=False,
              funnel_limits=[{"name": "requests", "rate": "20/s", "adaptive": RULE}])  # fmt: skip
    def call(self: Any, status: int | None) -> str:
        # a 429 on the first run only: the deferred run then succeeds
        if status == 429 and redis_client.incr(f"runs:{self.request.id}") == 1:
            self.funnel_feedback({}, status=429)  # does not return
        elif status != 429:
            self.funnel_feedback({}, status=status)  # the deferred run reports nothing
        return "ok"

    app.conf.test_task = name
    yield app
    close_app(app)


def held(app: Celery) -> float:
    """Seconds until the task's funnel is idle (a peek)."""
    runtime = runtime_for(app)
    key = runtime.task_key(app.conf.test_task, "")
    return runtime.funnel.throttle(key, 0, 20, 1, 0).reset_after


def test_a_429_lowers_the_rate_every_worker_decides_with(app: Celery) -> None:
    task, key = app.tasks[app.conf.test_task], runtime_for(app).task_key(app.conf.test_task, "")
    table = live_for(app).adaptive
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        assert task.delay(429).get(timeout=20) == "ok"  # refused once, deferred, ran
        assert control.adaptive_rates(app) == {key: 1.0}
        table.load({})  # forget it here: the live thread reads it back from Redis
        wait_for(lambda: table.all() == {key: 1_000_000})
        wait_for(lambda: held(app) == 0.0)  # the 429's hold is over
        assert task.delay(None).get(timeout=20) == "ok"
        assert held(app) > 0.5  # admitted at 1/s: a second booked, not 0.05 s

        def climbed() -> bool:
            assert task.delay(200).get(timeout=20) == "ok"
            return control.adaptive_rates(app) != {key: 1.0}

        wait_for(climbed)
        assert control.adaptive_rates(app) == {key: 2.0}  # +1/s after a success
