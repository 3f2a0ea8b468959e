"""``celery -A proj funnel status|inspect|reset`` through Celery's own command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from celery_funnel import RedisFunnel
from celery_funnel.testing import free_port

pytestmark = pytest.mark.redis
ROOT = str(Path(__file__).resolve().parents[2])


def celery_funnel(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "funnel", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False,
    )  # fmt: skip


def test_status_inspect_and_reset(redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.flushall()
    funnel = RedisFunnel(redis_client)
    # proj.hourly: 1/h, so the funnel outlives the command's start-up
    funnel.reserve("funnel:{proj.hourly}", 0, 1, 3600, ticket="first")  # admitted
    funnel.reserve("funnel:{proj.hourly}", 0, 1, 3600, ticket="second")  # booked

    done = celery_funnel(redis_url, "status", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json.loads(done.stdout) if r["key"] == "funnel:{proj.hourly}"]
    assert (row["kind"], row["rate"], row["capacity"], row["reservations"]) == (
        "gcra",
        "1/h",
        1,
        1,
    )
    assert row["remaining"] == 0
    assert 7000 < row["reset_after"] <= 7200  # two hours booked

    done = celery_funnel(redis_url, "inspect", "funnel:{proj.hourly}", "--json")
    assert done.returncode == 0, done.stderr
    assert [t["ticket"] for t in json.loads(done.stdout)["tickets"]] == ["second"]

    table = celery_funnel(redis_url, "status")
    assert "funnel:{proj.hourly}" in table.stdout
    assert "1/h" in table.stdout

    done = celery_funnel(redis_url, "reset", "funnel:{proj.hourly}")
    assert done.returncode == 0, done.stderr
    assert redis_client.keys("*funnel:{proj.hourly}*") == []


def test_unreachable_redis_is_a_clear_error() -> None:
    done = celery_funnel(f"redis://127.0.0.1:{free_port()}/0", "status")
    assert done.returncode != 0
    assert "cannot reach the funnels' Redis" in done.stderr
