"""``celery -A proj funnel status|parked|release|purge`` over parked tasks, through
Celery's own command line."""

from __future__ import annotations

import json

import pytest
import redis

from celery_funnel import RedisFunnel
from celery_funnel._limiter.keys import task_key
from celery_funnel._stores.park import ParkStore
from tests.integration.test_cli import celery_funnel
from tests.integration.test_park import message

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)


def test_parked_tasks_are_shown_released_and_purged(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    RedisFunnel(redis_client).reserve(task_key("funnel:", "proj.hourly"), 0, 1, 3600, ticket="a")
    store = ParkStore(redis_client, "funnel:")
    for n in range(3):
        store.park(f"h{n}", 3600.0, message(n, "proj.hourly"), "")
    store.park("s0", 3600.0, message(9, "limit:proj.*"), "")

    table = celery_funnel(redis_url, "status")
    assert table.returncode == 0, table.stderr
    assert "parked: 3 tasks of proj.hourly" in table.stdout
    assert "parked: 1 task of limit:proj.*" in table.stdout
    assert "not funnels" not in table.stdout, "parked keys are not foreign keys"
    rows = json.loads(celery_funnel(redis_url, "status", "--json").stdout)
    (row,) = [r for r in rows if not r.get("idle")]  # the funnel found in Redis
    assert row["parked"] == 3

    listing = json.loads(celery_funnel(redis_url, "parked", "proj.hourly", "--json").stdout)
    assert [t["task_id"] for t in listing["tasks"]] == ["h0", "h1", "h2"]
    assert "(in 35" in listing["tasks"][0]["release"], "UTC, then how far from now"

    refused = celery_funnel(redis_url, "purge", "limit:proj.*")  # no terminal: no
    assert refused.returncode != 0
    assert store.counts() == {"proj.hourly": 3, "limit:proj.*": 1}
    done = celery_funnel(redis_url, "purge", "limit:proj.*", "--yes")
    assert "purged 1 parked task\n" in done.stdout, done.stderr
    done = celery_funnel(redis_url, "release", "proj.hourly", "--yes")
    assert "released 3 parked tasks" in done.stdout, done.stderr
    _, _, due = store.claim(0.0, 30.0, 10, 3600.0)
    assert sorted(r.task_id for r in due) == ["h0", "h1", "h2"]
