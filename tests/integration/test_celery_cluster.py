"""The shared limit across several real ``celery worker`` processes on a real Redis
broker: nothing lost, nothing run twice, never more than the funnel allows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_funnel._limiter.keys import limit_key, task_key
from celery_funnel._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from celery_funnel.testing import CeleryWorkers, peak
from tests.integration.proj import close_app, make_app, runs
from tests.redis_monitor import funnel_log, one_slot_each, started_early

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def cluster_env(redis_url: str, redis_client: redis.Redis) -> dict[str, str]:
    redis_client.flushall()
    return {"FUNNEL_TEST_BROKER": redis_url, "FUNNEL_TEST_REDIS": redis_url}


@pytest.mark.parametrize(
    ("task", "limits"),
    [("proj.limited", None), ("proj.plain", {"proj.plain": "10/s"})],
    ids=["FunnelTask", "funnel_limits"],
)
def test_two_workers_share_one_funnel(
    cluster_env: dict[str, str], redis_url: str, task: str, limits: Any
) -> None:
    env = dict(cluster_env)
    if limits:
        env["FUNNEL_TEST_LIMITS"] = json.dumps(limits)
    app = make_app(redis_url, redis_url, funnel_limits=limits or {})
    key = limit_key("funnel:", task) if limits else task_key("funnel:", task)
    with (
        funnel_log(redis_url, key) as log,
        CeleryWorkers("tests.integration.proj", 2, env, "-c", "2", "-Q", "proj", cwd=ROOT),
    ):
        results = [app.tasks[task].delay(i) for i in range(20)]
        assert sorted(r.get(timeout=60) for r in results) == list(range(20))
    recorded = [r for r in runs(redis_url) if r["name"] == task]
    assert sorted(r["args"][0] for r in recorded) == list(range(20)), "each ran exactly once"
    assert len({r["worker"] for r in recorded}) == 2, "both workers took part"
    # 10/s, capacity 1, read from the funnel's decisions on Redis's clock: one decision
    # a run, each one 0.1 s slot, no run before its slot (so never more than 11 in a
    # second). Was: <= 11 starts in any second of the workers' clock (a loaded machine
    # bunches starts that waited for the CPU)
    writes = log.decisions(key)
    assert len(writes) == 20, "one decision a run"
    slots = one_slot_each(writes, 0.1, before=log.first_tat(key))
    assert peak(slots) <= 11
    assert started_early([r["at"] for r in recorded], slots, DEFAULT_EARLY_SECONDS) == []
    close_app(app)
