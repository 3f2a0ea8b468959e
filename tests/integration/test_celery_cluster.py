"""The shared limit across several real ``celery worker`` processes on a real Redis
broker: nothing lost, nothing run twice, never more than the funnel allows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_funnel.testing import CeleryWorkers, peak
from tests.integration.proj import close_app, make_app, runs

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
    with CeleryWorkers("tests.integration.proj", 2, env, "-c", "2", "-Q", "proj", cwd=ROOT):
        results = [app.tasks[task].delay(i) for i in range(20)]
        assert sorted(r.get(timeout=60) for r in results) == list(range(20))
    recorded = [r for r in runs(redis_url) if r["name"] == task]
    assert sorted(r["args"][0] for r in recorded) == list(range(20)), "each ran exactly once"
    assert len({r["worker"] for r in recorded}) == 2, "both workers took part"
    assert peak([r["at"] for r in recorded]) <= 11  # 10/s, capacity 1
    close_app(app)
