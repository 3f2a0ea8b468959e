"""Debounced tasks (``funnel_debounce``) on real ``celery worker`` processes and a real
Redis with AOF: a burst per key runs once, with the last send's arguments, the debounce
time after the last send; a thousand keys each run once; with a rate and a concurrency
limit on the same task; on RabbitMQ too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
import redis
from celery import Celery
from prometheus_client import CollectorRegistry

from celery_funnel._stores.park import ParkStore
from celery_funnel.dashboard._state import funnel_state
from celery_funnel.testing import RedisServer
from tests.integration.conftest import ROOT, Recorder, nothing_left, sample
from tests.integration.proj import close_app, make_app, runs
from tests.integration.test_one_gate import once_each, workers
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _debounced_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test project's debounced tasks, here and in the workers started here."""
    monkeypatch.setenv("FUNNEL_TEST_DEBOUNCE", "1")


def parked(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return ParkStore(client, "funnel:").count()


def bursts(
    app: Celery, name: str, keys: list[str], sends: int, spacing: float,
    got: dict[str, int] | None = None,
) -> tuple[dict[str, set[str]], dict[str, tuple[int, float]]]:  # fmt: skip
    """``sends`` sends per key, one round of all keys every ``spacing`` seconds: the ids
    each key's sends got, and each key's last send (n, when it began: Redis opens the
    window when the send reaches it, after that and before the send returns). ``got``
    is given each id's last send (its n)."""
    ids: dict[str, set[str]] = defaultdict(set)
    last: dict[str, tuple[int, float]] = {}
    task = app.tasks[name]
    for n in range(sends):
        round_started = time.monotonic()
        for key in keys:
            began = time.time()
            task_id = task.delay(key, n).id
            ids[key].add(task_id)
            last[key] = (n, began)
            if got is not None:
                got[task_id] = n
        # paces the sends (this is the load, not a wait for state)
        time.sleep(max(spacing - (time.monotonic() - round_started), 0))
    return ids, last


def check_runs(url: str, name: str, ids: dict[str, set[str]], last: dict[str, tuple[int, float]],
               low: float, high: float) -> None:  # fmt: skip
    recorded = once_each(url, name, {i for found in ids.values() for i in found})
    by_key = {r["args"][0]: r for r in recorded}
    assert sorted(by_key) == sorted(ids), "one run per key"
    for key, record in by_key.items():
        n, sent_at = last[key]
        after = record["at"] - sent_at
        print(f"{key}: ran with n={record['args'][1]} {after:.2f} s after its last send")
        assert record["args"] == [key, n], "the last send's arguments"
        assert low <= after <= high


def test_bursts_of_two_keys_run_once_each_with_the_last_arguments(
    standalone_url: str, on_broker: Celery, recorder: Recorder, registry: CollectorRegistry
) -> None:
    """Debounce 1 s, 20 sends per key for two keys over 2 s: one run per key, with the
    last send's arguments, 1 to 3 s after that key's last send; every send of a key got
    the run's id; the 38 sends that joined a waiting run were counted."""
    ids, last = bursts(on_broker, "proj.debounced", ["a", "b"], 20, 0.1)
    assert all(len(found) == 1 for found in ids.values()), ids
    wait_for(lambda: len(runs(standalone_url)) >= 2 and parked(standalone_url) == 0, 30)
    check_runs(standalone_url, "proj.debounced", ids, last, 1.0, 3.0)
    collapsed = recorder.of("task_collapsed")
    assert len(collapsed) == 38
    assert {c["task_id"] for c in collapsed} == {i for found in ids.values() for i in found}
    labels = {"funnel": "proj.debounced", "kind": "debounce"}
    assert sample(registry, "celery_funnel_collapsed_total", **labels) == 38


def test_a_thousand_keys_run_once_each(standalone_url: str, broker: RedisServer) -> None:
    """1,000 keys debounced at once, each sent twice in a row (well within the debounce
    time, 1 s, however slow a round of 1,000 sends is): every key runs once, with its
    last send's arguments, under the one task id both its sends were given."""
    app = make_app(broker.url, standalone_url)
    keys = [f"k{i}" for i in range(1000)]
    task = app.tasks["proj.debounced"]
    ids: dict[str, list[str]] = defaultdict(list)
    try:
        with workers(broker.url, standalone_url, 2) as started:
            started.wait_ready()
            for key in keys:
                for n in range(2):
                    ids[key].append(task.delay(key, n).id)
            every = {i for found in ids.values() for i in found}
            assert len(every) == len(keys), "a key's two sends share one window"
            wait_for(
                lambda: len(runs(standalone_url)) >= len(every) and parked(standalone_url) == 0,
                120,
            )
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)  # no run can come after this
    recorded = once_each(standalone_url, "proj.debounced", every)
    last = {r["id"]: r["args"][1] for r in recorded}
    assert all(last[ids[key][1]] == 1 for key in keys), "each ran with its last send"


def test_with_a_rate_and_a_concurrency_limit(standalone_url: str, broker: RedisServer) -> None:
    """Debounce 0.5 s (at most 2 s) under 2/s and 1 at once per key: a key sent every
    0.2 s for 3 s runs at the 2 s bound and again after its last send, each run with
    the arguments of the last send before it; no send is lost."""
    app = make_app(broker.url, standalone_url)
    got: dict[str, int] = {}  # each window's id: the n of its last send
    try:
        with workers(broker.url, standalone_url, 2) as started:
            started.wait_ready()
            ids, _ = bursts(app, "proj.debounced_limited", ["a"], 15, 0.2, got)
            assert len(ids["a"]) >= 2  # the bound closed the first window mid-burst
            wait_for(lambda: len(runs(standalone_url)) >= len(ids["a"]), 30)
            wait_for(lambda: parked(standalone_url) == 0, 30)
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)  # no run can come after this
    recorded = once_each(standalone_url, "proj.debounced_limited", ids["a"])
    # each run with exactly the arguments of its window's last send
    assert sorted((r["id"], r["args"]) for r in recorded) == sorted(
        (task_id, ["a", n]) for task_id, n in got.items()
    )


def test_a_worker_refuses_to_start_where_debounced_sends_could_be_lost(
    broker: RedisServer,
) -> None:
    """A funnels' Redis without an append-only file would forget the waiting sends on a
    restart: the worker stops at start, with one line naming the task and the setting."""
    with RedisServer() as forgetful:  # appendonly no
        started = workers(broker.url, forgetful.url, 1).start()
        try:
            wait_for(lambda: started.processes[0].poll() is not None, 60)
            logs = started.logs()
        finally:
            started.stop()
    assert "task 'proj.debounced': funnel_debounce=1 keeps each key's last send" in logs


def test_no_send_is_lost_when_the_only_worker_is_sigkilled(
    standalone_url: str, broker: RedisServer
) -> None:
    """50 keys sent twice, the only worker SIGKILLed before they are due: nothing runs
    while no worker is up; the next worker runs every key once, with its last send."""
    app = make_app(broker.url, standalone_url)
    try:
        doomed = workers(broker.url, standalone_url, 1).start()
        try:
            doomed.wait_ready()
            ids, last = bursts(app, "proj.debounced", [f"k{i}" for i in range(50)], 2, 0.0)
            os.killpg(doomed.processes[0].pid, signal.SIGKILL)
        finally:
            doomed.stop()
        assert runs(standalone_url) == []
        assert parked(standalone_url) == 50  # kept in the funnels' Redis, no worker up
        with workers(broker.url, standalone_url, 1) as started:
            started.wait_ready()
            wait_for(lambda: len(runs(standalone_url)) >= 50 and parked(standalone_url) == 0, 60)
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)  # no run can come after this
    check_runs(standalone_url, "proj.debounced", ids, last, 1.0, 120.0)


def test_a_send_after_the_release_opens_a_new_window(
    standalone_url: str, broker: RedisServer
) -> None:
    """Debounce 0.2 s, then 1 run every 3 s over all keys (waits parked past 0.5 s):
    of keys a and b released together, one waits parked again by the gate. Sends made
    then get new ids (their keys' runs were released): 4 runs, each once, none lost."""
    app = make_app(broker.url, standalone_url)
    task = app.tasks["proj.debounced_slow"]
    try:
        with workers(broker.url, standalone_url, 1, FUNNEL_TEST_CONF='{"funnel_park_after": 0.5}'):
            first = {key: task.delay(key, 0).id for key in "ab"}
            with redis.Redis.from_url(standalone_url) as client:
                store = ParkStore(client, "funnel:")
                wait_for(lambda: set(store.counts()) == {"proj.debounced_slow"}, 30)
            second = {key: task.delay(key, 1).id for key in "ab"}
            assert all(second[key] != first[key] for key in "ab")
            wait_for(lambda: len(runs(standalone_url)) >= 4 and parked(standalone_url) == 0, 60)
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)  # no run can come after this
    recorded = once_each(standalone_url, "proj.debounced_slow", {*first.values(), *second.values()})
    assert sorted((r["args"][0], r["args"][1]) for r in recorded) == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1),
    ]  # fmt: skip


def test_the_dashboard_counts_keys_held_and_waiting(
    standalone_url: str, broker: RedisServer
) -> None:
    """No worker runs: 3 debounced keys wait, 2 unique keys are held; the dashboard's
    state says so per task."""
    app = make_app(broker.url, standalone_url)
    try:
        for key in "abc":
            app.tasks["proj.debounced"].delay(key)
        for key in "ab":
            app.tasks["proj.unique"].delay(key)
        rows = {(r["task"], r["kind"]): r["keys"] for r in funnel_state(app)["dedupe"]}
    finally:
        close_app(app)
    assert rows[("proj.debounced", "debounce")] == 3
    assert rows[("proj.unique", "unique")] == 2
    assert rows[("proj.unique_limited", "unique")] == 0


def send_from_another_process(broker_url: str, funnel_url: str, key: str, n: int) -> str:
    """A debounced send of ``key`` from a producer process of its own (which never sent
    before: it remembers no window); the id it got."""
    code = (
        "import sys\n"
        "from tests.integration.proj import close_app, make_app\n"
        "app = make_app(sys.argv[1], sys.argv[2])\n"
        "try:\n"
        "    print(app.tasks['proj.debounced'].delay(sys.argv[3], int(sys.argv[4])).id)\n"
        "finally:\n"
        "    close_app(app)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, broker_url, funnel_url, key, str(n)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_sends_from_several_producers_join_one_window(
    standalone_url: str, broker: RedisServer
) -> None:
    """No worker runs while the sends are made, so each window stays open until one
    starts. A send from another producer process (which remembers no window of the
    key) joins the window this process opened: one id, one run, with the other's (last)
    arguments. Once that ran, another process opens a new window; a send from this
    process, which remembers the closed window's id, joins the new one."""
    app = make_app(broker.url, standalone_url)
    task = app.tasks["proj.debounced"]
    try:
        first = task.delay("k", 0).id
        assert send_from_another_process(broker.url, standalone_url, "k", 1) == first
        assert parked(standalone_url) == 1
        with workers(broker.url, standalone_url, 1) as started:
            started.wait_ready()
            wait_for(lambda: len(runs(standalone_url)) >= 1 and parked(standalone_url) == 0, 60)
        second = send_from_another_process(broker.url, standalone_url, "k", 2)
        assert second != first  # the first window's run was released: a new window
        assert task.delay("k", 3).id == second  # this process guessed the closed one
        assert send_from_another_process(broker.url, standalone_url, "k", 4) == second
        assert task.delay("k", 5).id == second
        assert parked(standalone_url) == 1
        with workers(broker.url, standalone_url, 1) as started:
            started.wait_ready()
            wait_for(lambda: len(runs(standalone_url)) >= 2 and parked(standalone_url) == 0, 60)
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)  # no worker: nothing can run any more
    recorded = once_each(standalone_url, "proj.debounced", {first, second})
    assert sorted((r["id"] == second, r["args"]) for r in recorded) == [
        (False, ["k", 1]), (True, ["k", 5])
    ]  # fmt: skip
