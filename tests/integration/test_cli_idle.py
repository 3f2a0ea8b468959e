"""``celery funnel status`` and ``inspect`` show every funnel the app configures, idle
ones too (an app that ran no task has no funnel key in Redis), each row with the limit in
force, a live override included (``status`` printed only a header before any task ran,
``inspect`` answered "no funnel" for a task with a limit, and an overridden funnel's row
showed the code's limit)."""

from __future__ import annotations

import json

import pytest
import redis

from celery_funnel import RedisFunnel
from celery_funnel._limiter.keys import limit_key, task_key
from tests.integration.test_cli import celery_funnel

pytestmark = pytest.mark.redis
ONE_REDIS = True
LIMITS = json.dumps({"emails.*": "100/m", "reports.*": {"concurrency": 3}})


def status(url: str) -> dict[str, dict[str, object]]:
    done = celery_funnel(url, "status", "--json", FUNNEL_TEST_LIMITS=LIMITS)
    assert done.returncode == 0, done.stderr
    return {f"{r['key']} {r['kind']}": r for r in json.loads(done.stdout)}


def test_status_and_inspect_list_idle_funnels(redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.flushall()
    rows = status(redis_url)
    limited = rows[f"{task_key('funnel:', 'proj.limited')} gcra"]
    assert (limited["rate"], limited["capacity"], limited["remaining"]) == ("10/s", 1, 1)
    assert (limited["idle"], limited["note"]) == (True, "idle")
    per_customer = rows[f"{task_key('funnel:', 'proj.per_customer')} gcra"]
    assert per_customer["note"] == "idle; one funnel per funnel_key value"
    emails = rows[f"{limit_key('funnel:', 'emails.*')} gcra"]
    assert (emails["name"], emails["rate"]) == ("limit:emails.*", "100/m")
    reports = rows[f"{limit_key('funnel:', 'reports.*')} concurrency"]
    assert (reports["capacity"], reports["in_use"], reports["remaining"]) == (3, 0, 3)
    assert redis_client.keys("*") == []  # reading touched nothing

    table = celery_funnel(redis_url, "status", FUNNEL_TEST_LIMITS=LIMITS).stdout
    assert "funnel:{proj.limited}" in table
    assert len(table.splitlines()) > 10  # not just a header
    widest = max(table.splitlines(), key=len)
    assert len(widest) <= 100, f"a row of {len(widest)} columns: {widest}"  # 161 before
    assert "  note: idle; one funnel per funnel_key value" in table  # a long note: its own line

    done = celery_funnel(redis_url, "inspect", "proj.hourly", "--json")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert (row["name"], row["rate"], row["note"], row["tickets"]) == (
        "proj.hourly", "1/h", "idle", []
    )  # fmt: skip
    done = celery_funnel(redis_url, "inspect", "proj.nothing")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("Error: no funnel 'proj.nothing'")


def test_rows_show_the_override_in_force(redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.flushall()
    hourly = task_key("funnel:", "proj.hourly")
    RedisFunnel(redis_client).throttle(hourly, 0, 1, 3600)  # a funnel in use
    for name, rate in (("proj.limited", "1/s"), ("proj.hourly", "2/h")):
        done = celery_funnel(redis_url, "set", name, rate, "--capacity", "3")
        assert done.returncode == 0, done.stderr
    rows = status(redis_url)
    limited = rows[f"{task_key('funnel:', 'proj.limited')} gcra"]
    assert (limited["rate"], limited["capacity"], limited["remaining"]) == ("1/s", 3, 3)
    assert limited["note"] == "idle; override (code 10/s, capacity 1)"
    used = rows[f"{hourly} gcra"]
    assert "idle" not in used
    assert (used["rate"], used["capacity"]) == ("2/h", 3)
    assert used["note"] == "override (code 1/h, capacity 1)"
