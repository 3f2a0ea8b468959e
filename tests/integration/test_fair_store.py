"""The fair-share scripts on a real Redis: who is admitted at once, the order in which
waiting tasks get slots (weighted round-robin between tenants, priority then arrival
within one), tickets, and how long a tenant's state lives."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_funnel._limiter.fair import Fair
from celery_funnel._limiter.keys import fair_keys
from celery_funnel._stores.fair import FairStore, fair_status
from celery_funnel._stores.park import ParkStore
from tests.polling import wait_for

# every script touches only the keys it is given (read from what Redis ran)
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("declared_keys_only")]
ONE_REDIS = True

ROOT = str(Path(__file__).resolve().parents[2])
T = 50_000  # µs: 20/s, capacity 1
SHAPE = (T, T)


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def store(redis_client: redis.Redis, prefix: str) -> FairStore:
    return FairStore(redis_client, prefix)


@pytest.fixture
def key(prefix: str) -> str:
    return f"{prefix}{{fair.t}}"


def enqueue(store: FairStore, key: str, task_id: str, tenant: str, **more: Any) -> bool:
    fair = Fair(tenant, more.get("weight", 1.0))
    order = (more.get("rank", 0), more.get("front", False))
    return store.enqueue(key, task_id, fair, order, 1, SHAPE)


def order(store: FairStore, key: str, horizon: float = 60.0) -> list[str]:
    return [task_id for task_id, _ in store.pop(key, horizon, 1000, 10.0).slots]


def test_an_idle_funnel_admits_any_tenant_and_a_funnel_with_waiting_tasks_none(
    store: FairStore, key: str
) -> None:
    assert store.admit(key, "a1", SHAPE, (T, T), "A") == (0, 0), "idle: admitted at once"
    assert store.admit(key, "a2", SHAPE, (T, T), "A") == (2, 0), "full: join the queue"
    enqueue(store, key, "a2", "A")
    time.sleep(T / 1e6 * 2)  # the funnel has room again ...
    assert store.admit(key, "b1", SHAPE, (T, T), "B") == (2, 0), "... but a task waits"


def test_slots_go_round_robin_weighted_then_by_priority_and_arrival(
    store: FairStore, key: str
) -> None:
    for n in range(6):
        enqueue(store, key, f"a{n}", "A", rank=5)
    for n in range(3):
        enqueue(store, key, f"b{n}", "B", weight=2.0, rank=5)
    enqueue(store, key, "a-urgent", "A", rank=0)
    enqueue(store, key, "a-low", "A", rank=9)
    enqueue(store, key, "a-missed", "A", rank=5, front=True)
    popped = store.pop(key, 60.0, 1000, 10.0)
    # B weighs 2: two of B's for each of A's (ties: by name); within A, the highest
    # priority, then the one that missed its slot, then arrival order
    assert [task_id for task_id, _ in popped.slots] == [
        "a-urgent", "b0", "b1", "a-missed", "b2", "a0", "a1", "a2", "a3", "a4", "a5", "a-low",
    ]  # fmt: skip
    slots = [slot for _, slot in popped.slots]
    assert all(b - a == T for a, b in itertools.pairwise(slots)), "one slot each"


def test_the_brokers_priority_comes_before_fair_share(store: FairStore, key: str) -> None:
    for n in range(4):
        enqueue(store, key, f"b{n}", "B", rank=9)
    for n in range(3):
        enqueue(store, key, f"a{n}", "A", rank=0)
    # fair share alone would alternate a0 b0 a1 b1 ...: the urgent tasks go first
    assert order(store, key) == ["a0", "a1", "a2", "b0", "b1", "b2", "b3"]
    enqueue(store, key, "b-urgent", "B", rank=0)
    enqueue(store, key, "a-late", "A", rank=9)
    enqueue(store, key, "c0", "C", rank=9)
    # B's urgent task first; then fair share between the tenants of the same rank
    assert order(store, key) == ["b-urgent", "a-late", "c0"]


def test_priority_orders_a_tenants_queue(store: FairStore, key: str) -> None:
    for n in range(3):
        enqueue(store, key, f"low{n}", "A", rank=9)
    enqueue(store, key, "high", "A", rank=0)
    assert order(store, key) == ["high", "low0", "low1", "low2"]


def test_a_tenant_that_becomes_active_starts_at_the_current_virtual_time(
    store: FairStore, key: str
) -> None:
    for n in range(10):
        enqueue(store, key, f"a{n}", "A")
    assert order(store, key, horizon=0.2) == ["a0", "a1", "a2", "a3", "a4"]
    enqueue(store, key, "b0", "B")
    enqueue(store, key, "b1", "B")
    time.sleep(0.3)
    # B has no credit for the time it had nothing waiting: it alternates with A
    assert order(store, key, horizon=0.3)[:4] in (
        ["a5", "b0", "a6", "b1"],
        ["b0", "a5", "b1", "a6"],
    )


def test_a_tenants_state_goes_when_its_queue_empties(
    store: FairStore, key: str, redis_client: redis.Redis
) -> None:
    enqueue(store, key, "a0", "A", weight=3.0)
    enqueue(store, key, "b0", "B")
    assert not enqueue(store, key, "a0", "A"), "waiting already: kept where it is"
    assert [r.waiting for r in fair_status(redis_client, key)] == [1, 1]
    assert sorted(order(store, key)) == ["a0", "b0"]
    keys = fair_keys(key)
    left = {k for k in keys if redis_client.exists(k)}
    # the funnel (its TAT), its tickets and the last seconds' admission counts remain,
    # each with an expiry; no queue, tenant, weight or virtual time
    assert left <= {keys[0], keys[1], *keys[6:]}
    assert all(redis_client.pttl(k) > 0 for k in left)


def test_a_booked_ticket_is_admitted_in_its_window_and_a_missed_one_keeps_its_turn(
    store: FairStore, key: str
) -> None:
    enqueue(store, key, "a0", "A")
    enqueue(store, key, "a1", "A")
    enqueue(store, key, "a2", "A")
    enqueue(store, key, "a3", "A")
    slots = dict(store.pop(key, 1.0, 3, 10.0).slots)
    status, delay = store.admit(key, "a2", SHAPE, (T, T), "A")
    assert status == 1, "early: wait for its slot"
    assert 0 < delay <= slots["a2"] - slots["a0"] + T
    wait_for(lambda: store.admit(key, "a0", SHAPE, (T, T), "A") == (0, 0), 1)
    time.sleep((slots["a1"] - slots["a0"]) / 1e6 + 0.2)  # a1 comes far too late
    assert store.admit(key, "a1", SHAPE, (T, T), "A") == (2, 1), "missed: in front again"
    assert store.admit(key, "a9", SHAPE, (T, T), "A") == (2, 0), "a task waits: queued"


def test_the_dispatchers_of_several_workers_never_hand_out_a_slot_twice(
    store: FairStore, key: str
) -> None:
    for n in range(300):
        enqueue(store, key, f"t{n}", f"tenant-{n % 30}")
    booked: list[tuple[str, int]] = []
    lock = threading.Lock()

    def dispatcher() -> None:
        for _ in range(40):
            slots = store.pop(key, 2.0, 7, 10.0).slots
            with lock:
                booked.extend(slots)

    threads = [threading.Thread(target=dispatcher) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [task_id for task_id, _ in booked]
    assert len(ids) == len(set(ids)), "no task booked twice"
    slots = sorted(slot for _, slot in booked)
    assert all(b - a >= T for a, b in itertools.pairwise(slots)), "never faster"


def message(task_id: str) -> dict[str, Any]:
    return {
        "body": b"{}", "content_type": "application/json", "content_encoding": "utf-8",
        "headers": {"task": "t", "id": task_id}, "properties": {}, "priority": None,
        "exchange": "", "routing_key": "q", "declare": [],
        "meta": {"task": "t", "funnel": "t", "priority": None, "parked_at": time.time()},
    }  # fmt: skip


def test_purged_waiting_tasks_leave_their_queues(
    store: FairStore, redis_client: redis.Redis, prefix: str, key: str
) -> None:
    parked = ParkStore(redis_client, prefix)
    for n in range(3):
        assert parked.park(f"a{n}", 3600.0, message(f"a{n}"), "")
        enqueue(store, key, f"a{n}", "A")
    enqueue(store, key, "b0", "B")
    store.enlist(key)
    assert parked.purge() == 3
    assert [(r.tenant, r.waiting) for r in fair_status(redis_client, key)] == [("B", 1)]
    assert order(store, key) == ["b0"], "no slot for a purged task"


def test_waiting_parked_tasks_are_made_due_at_their_slots(
    store: FairStore, redis_client: redis.Redis, prefix: str, key: str
) -> None:
    parked = ParkStore(redis_client, prefix)
    assert parked.park("a", 3600.0, message("a"), "")
    now = int(redis_client.time()[0]) * 1_000_000
    assert store.due([("a", now), ("gone", now)]) == ["gone"]
    _, _, releases = parked.claim(0.0, 30.0, 10, 3600.0)
    assert [r.task_id for r in releases] == ["a"]
    store.enlist(key)
    assert store.enlisted(10) == [key]
    assert not store.delist(key, 60.0), "a task joined its queue within 60 s"
    assert store.delist(key, 0.0)
    assert store.enlisted(10) == []


def test_status_shows_each_tenant_waiting_and_admitted(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    store, key = FairStore(client, "funnel:"), "funnel:{fair.shared}"  # fair_proj's task
    for n in range(3):
        enqueue(store, key, f"a{n}", "A")
    enqueue(store, key, "b0", "B")
    assert order(store, key, horizon=0.0) == ["a0"]  # one slot handed out
    env = {"FUNNEL_TEST_BROKER": redis_url, "FUNNEL_TEST_REDIS": redis_url, "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "celery", "-A", "tests.integration.fair_proj", "funnel"]
    done = subprocess.run(
        [*command, "status", "--json"], capture_output=True, text=True, timeout=60,
        cwd=ROOT, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json.loads(done.stdout) if r["key"] == key]
    assert [(t["tenant"], t["waiting"]) for t in row["fair"]] == [("B", 1), ("A", 2)]
    table = subprocess.run(
        [*command, "status"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
        check=False,
    ).stdout  # fmt: skip
    assert "tenant A: 2 deferred" in table
    client.flushall()
    client.close()
