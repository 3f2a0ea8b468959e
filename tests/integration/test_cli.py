"""``celery -A proj funnel status|inspect|reset|check`` through Celery's own command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from celery_funnel import RedisFunnel
from celery_funnel._limiter.keys import limit_key, task_key
from celery_funnel._limiter.rate import Rate
from celery_funnel._limiter.strategies.adapt import Adaptive
from celery_funnel._shared.adaptive import adaptive_key
from celery_funnel.testing import free_port

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)
ROOT = str(Path(__file__).resolve().parents[2])


def celery_funnel(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    env = {"FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url, "PATH": "/usr/bin:/bin", **env}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "funnel", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False,
    )  # fmt: skip


def test_status_inspect_and_reset(redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.flushall()
    funnel = RedisFunnel(redis_client)
    key = task_key("funnel:", "proj.hourly")
    assert key == "funnel:{proj.hourly}"
    # proj.hourly: 1/h, so the funnel outlives the command's start-up
    funnel.reserve(key, 0, 1, 3600, ticket="first")  # admitted
    funnel.reserve(key, 0, 1, 3600, ticket="second")  # booked

    done = celery_funnel(redis_url, "status", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json.loads(done.stdout) if r["key"] == key]
    assert (row["kind"], row["rate"], row["capacity"], row["reservations"]) == ("gcra", "1/h", 1, 1)
    assert row["remaining"] == 0
    assert 7000 < row["reset_after"] <= 7200  # two hours booked

    done = celery_funnel(redis_url, "inspect", "proj.hourly", "--json")
    assert done.returncode == 0, done.stderr
    (ticket,) = json.loads(done.stdout)["tickets"]
    assert ticket["ticket"] == "second"
    assert 3500 < ticket["in_seconds"] <= 3600
    assert "(in 3" in ticket["slot"]  # UTC, then how far from now

    table = celery_funnel(redis_url, "status")
    assert key in table.stdout
    assert "1/h" in table.stdout

    done = celery_funnel(redis_url, "reset", "proj.hourly")  # no --yes, no terminal: no
    assert done.returncode != 0
    assert redis_client.exists(key)
    done = celery_funnel(redis_url, "reset", "proj.hourly", "--yes")
    assert done.returncode == 0, done.stderr
    assert "funnel:{proj.hourly}#tickets" in done.stdout  # shown before deleting
    assert redis_client.keys("*") == []


def test_status_sees_every_strategy_and_survives_foreign_keys(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    funnel = RedisFunnel(redis_client)
    window = limit_key("funnel:", "proj.*")
    funnel.sliding_window(window, 5, 3600, windows=10)
    funnel.sliding_log(task_key("funnel:", "proj.gone"), 1, 3600)  # a task gone: no limit
    redis_client.set("funnel:junk", "not a funnel")  # foreign keys under the prefix
    redis_client.rpush("funnel:{proj.limited}", "wrong type")
    redis_client.hset("funnel:{a b}", "x", "y")
    limits = json.dumps({"proj.*": {"rate": "5/h", "strategy": "sliding_window"}})
    done = celery_funnel(redis_url, "status", "--json", FUNNEL_TEST_LIMITS=limits)
    assert done.returncode == 0, done.stderr
    rows = {r["key"]: r for r in json.loads(done.stdout) if not r.get("idle")}  # found
    assert set(rows) == {window, "funnel:{proj.gone}", "funnel:{proj.limited}"}
    assert (rows[window]["kind"], rows[window]["remaining"]) == ("sliding_window", 4)
    assert rows["funnel:{proj.gone}"]["kind"] == "zset (no limit of this app)"
    assert "WRONGTYPE" in rows["funnel:{proj.limited}"]["error"]


def test_unreachable_redis_is_a_clear_error_without_the_password() -> None:
    done = celery_funnel(f"redis://user:s3cret@127.0.0.1:{free_port()}/0", "status")
    assert done.returncode != 0
    assert "cannot reach the funnels' Redis" in done.stderr
    assert "user:****@127.0.0.1" in done.stderr
    assert "s3cret" not in done.stderr + done.stdout


def test_status_shows_the_adaptive_rate(redis_url: str, redis_client: redis.Redis) -> None:
    """proj.adaptive: 20/h, adaptive down to 1/h; a 429 halved it to 10/h."""
    redis_client.flushall()
    funnel = RedisFunnel(redis_client)
    key = task_key("funnel:", "proj.adaptive")
    funnel.reserve(key, 0, 20, 3600, ticket="first")  # the funnel exists (3 minutes)
    rule = Adaptive(Rate(1, 3600))
    funnel.adapt(adaptive_key("funnel:"), key, refused=True, adaptive=rule, rate=Rate(20, 3600))

    done = celery_funnel(redis_url, "status", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json.loads(done.stdout) if r["key"] == key]
    assert row["adaptive"] == "10/h (max 20/h, min 1/h; lowered by 429s)"
    table = celery_funnel(redis_url, "status")
    assert f"adaptive: {key} at 10/h (max 20/h" in table.stdout
