"""``celery funnel status``, ``inspect`` and the dashboard agree with themselves (issue
43, item 3): a paused funnel with parked tasks shows them in its row, not ``idle`` (the
footer counted them, the row said ``parked 0``); a limit's name shows whenever the limit
exists, idle or busy; ``inspect`` takes the keys ``status`` prints, so one limit of a task
with several can be inspected, idle or busy."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from celery_funnel import RedisFunnel, control
from celery_funnel._limiter.keys import limit_key
from celery_funnel._stores.concurrency import ConcurrencyFunnel, ConcurrencyStore
from celery_funnel._stores.park import ParkStore
from celery_funnel.dashboard._state import funnel_state
from tests.integration.proj import make_app
from tests.integration.test_cli import celery_funnel

pytestmark = pytest.mark.redis
ONE_REDIS = True
REQUESTS, TOKENS = "funnel:{proj.llm}:0", "funnel:{proj.llm}:1"


def rows_of(url: str) -> dict[str, dict[str, Any]]:
    done = celery_funnel(url, "status", "--json")
    assert done.returncode == 0, done.stderr
    return {r["key"]: r for r in json.loads(done.stdout) if "kind" in r and r["kind"] != "unique"}


def inspect(url: str, name: str) -> Any:
    done = celery_funnel(url, "inspect", name, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def park(client: redis.Redis, label: str, count: int) -> None:
    store = ParkStore(client, "funnel:")
    for i in range(count):
        meta = {"funnel": label, "task": label, "parked_at": time.time()}
        store.park(f"{label}-{i}", 3600.0, {"body": b"", "meta": meta}, "")


def test_a_paused_funnel_shows_its_parked_tasks_in_its_row(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    app = make_app(redis_url, redis_url)
    control.pause(app, "proj.hourly")
    park(redis_client, "proj.hourly", 10)  # parked by the pause: no funnel key in Redis
    park(redis_client, "proj.limited+proj.slow", 2)  # a label joining two funnels
    row = rows_of(redis_url)["funnel:{proj.hourly}"]
    assert (row["parked"], row["note"]) == (10, "PAUSED")
    assert "idle" not in row
    assert rows_of(redis_url)["funnel:{proj.slow}"]["parked"] == 2
    table = celery_funnel(redis_url, "status").stdout
    lines = table.splitlines()
    (at,) = [i for i, x in enumerate(lines) if x.startswith("funnel:{proj.hourly}")]
    line = lines[at] + (lines[at + 1] if lines[at + 1].startswith("  note:") else "")
    assert line.split()[-2:] in (["10", "PAUSED"], ["note:", "PAUSED"]), line  # parked, note
    assert " 10 " in line
    assert "idle" not in line
    assert "parked: 10 tasks of proj.hourly" in table  # the footer says the same
    shown = inspect(redis_url, "proj.hourly")
    assert (shown["parked"], shown["note"]) == (10, "PAUSED")
    by_name = {f["name"]: f for f in funnel_state(app)["funnels"]}
    assert by_name["proj.hourly"]["parked"] == 10


def test_limit_names_and_keys_idle_and_busy(redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.flushall()
    rows = rows_of(redis_url)  # idle: no key in Redis
    assert (rows[REQUESTS]["limit"], rows[TOKENS]["limit"]) == ("requests", "tokens")
    assert rows[TOKENS]["idle"] is True
    table = celery_funnel(redis_url, "status").stdout
    (line,) = [x for x in table.splitlines() if x.startswith(TOKENS)]
    assert line.split()[1] == "tokens", line
    tokens = inspect(redis_url, TOKENS)  # one limit of two, idle
    assert (tokens["key"], tokens["limit"], tokens["rate"], tokens["note"]) == (
        TOKENS, "tokens", "300/s", "idle"
    )  # fmt: skip
    both = inspect(redis_url, "proj.llm")
    assert [(r["key"], r["limit"]) for r in both] == [(REQUESTS, "requests"), (TOKENS, "tokens")]
    text = celery_funnel(redis_url, "inspect", TOKENS).stdout
    assert "limit          tokens" in text

    RedisFunnel(redis_client).throttle(TOKENS, 1499, 300, 10, quantity=1000)  # busy
    rows = rows_of(redis_url)
    assert "idle" not in rows[TOKENS]
    assert (rows[REQUESTS]["limit"], rows[TOKENS]["limit"]) == ("requests", "tokens")
    tokens = inspect(redis_url, TOKENS)
    assert (tokens["key"], tokens["limit"]) == (TOKENS, "tokens")
    assert tokens["remaining"] < 1500
    assert [r["limit"] for r in inspect(redis_url, "proj.llm")] == ["tokens", "requests"]
    requests = inspect(redis_url, REQUESTS)  # the other limit, still idle
    assert (requests["limit"], requests["note"]) == ("requests", "idle")

    app = make_app(redis_url, redis_url)
    (llm,) = [f for f in funnel_state(app)["funnels"] if f["name"] == "proj.llm"]
    assert [c["limit"] for c in llm["code"]] == ["requests", "tokens"]


def test_a_busy_concurrency_funnel_can_be_inspected(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    limits = json.dumps({"reports.*": {"concurrency": 3}})
    key = limit_key("funnel:", "reports.*")
    store = ConcurrencyStore(redis_client, "funnel:", 600.0)
    lease, _ = store.take([ConcurrencyFunnel(3, key, "limit:reports.*")], "job-1", "w1@host")
    assert lease is not None
    for name in ("limit:reports.*", key):  # "no funnel" before
        done = celery_funnel(redis_url, "inspect", name, "--json", FUNNEL_TEST_LIMITS=limits)
        assert done.returncode == 0, done.stderr
        row = json.loads(done.stdout)
        assert (row["key"], row["kind"], row["capacity"], row["in_use"]) == (
            key, "concurrency", 3, 1
        )  # fmt: skip
        assert [h["task_id"] for h in row["holders"]] == ["job-1"]
    text = celery_funnel(redis_url, "inspect", key, FUNNEL_TEST_LIMITS=limits).stdout
    assert "seat: task job-1 on w1@host, running " in text
