"""Unique tasks (``funnel_unique``) on real ``celery worker`` processes and a real Redis:
a burst of identical sends publishes one task, which runs once; a send after it finished
runs again; a duplicate sent past ``FunnelTask.apply_async`` is dropped at the worker;
a SIGKILLed worker's key is free again within its lease."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from celery import Celery, states
from prometheus_client import CollectorRegistry

from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import RedisServer
from tests.integration.conftest import Recorder, nothing_left, sample
from tests.integration.proj import RELEASE, close_app, make_app, runs
from tests.integration.test_cli import celery_funnel
from tests.integration.test_observability import Events
from tests.integration.test_one_gate import once_each, workers
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]

KEY = "funnel:{proj.unique:a}#unique"


def holder(url: str) -> str | None:
    with redis.Redis.from_url(url) as client:
        value = client.get(KEY)
    return None if value is None else value.decode()


def test_a_burst_runs_once_and_a_send_after_it_finished_runs_again(
    standalone_url: str, on_broker: Celery, recorder: Recorder, registry: CollectorRegistry
) -> None:
    """10 identical sends at once return one task id and make one run; once it ended
    (the key freed at its end, not by its TTL of 600 s), a new send runs again. The 9
    sends that published nothing were counted."""
    task = on_broker.tasks["proj.unique"]
    # the run lasts 5 s (was 0.5 s): the 10 sends must all come while it holds the key,
    # and on a loaded machine they took longer than 0.5 s (a second id was published)
    burst = {task.delay("a", n, seconds=5.0).id for n in range(10)}
    assert len(burst) == 1
    (first,) = burst
    assert holder(standalone_url) == first
    wait_for(lambda: len(runs(standalone_url)) >= 1, 30)
    wait_for(lambda: holder(standalone_url) is None, 30)  # freed at the run's end
    again = task.delay("a", 99).id
    assert again != first
    wait_for(lambda: len(runs(standalone_url)) >= 2, 30)
    wait_for(lambda: holder(standalone_url) is None, 30)
    recorded = once_each(standalone_url, "proj.unique", {first, again})
    assert sorted(r["args"][1] for r in recorded) == [0, 99]  # the first send's arguments
    assert [c["task_id"] for c in recorder.of("task_collapsed")] == [first] * 9
    labels = {"funnel": "proj.unique", "kind": "unique"}
    assert sample(registry, "celery_funnel_collapsed_total", **labels) == 9


def test_unique_under_a_rate_and_a_concurrency_limit(
    standalone_url: str, broker: RedisServer
) -> None:
    """Unique per key, 2/s over all keys, one at a time per key: bursts of 10 sends on 4
    keys make 4 tasks, deferred by the rate (published again or held: the same ids keep
    their keys), each run once; the keys are all free after. The runs last until every
    send is made (``hold``): a run that ended would free its key for the next send."""
    app = make_app(broker.url, standalone_url)
    task = app.tasks["proj.unique_limited"]
    try:
        with workers(broker.url, standalone_url, 2) as started:
            started.wait_ready()
            sends = {key: [task.delay(key, n, hold=True).id for n in range(10)] for key in "abcd"}
            with redis.Redis.from_url(standalone_url) as client:
                client.set(RELEASE, 1)
                assert {key: len(set(found)) for key, found in sends.items()} == dict.fromkeys(
                    "abcd", 1
                ), sends
                wait_for(lambda: len(runs(standalone_url)) >= 4, 30)
                wait_for(lambda: not list(client.scan_iter("funnel:*#unique")), 30)
            again = {task.delay(key, 10).id for key in "ab"}
            wait_for(lambda: len(runs(standalone_url)) >= 6, 30)
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)  # no run can come after this
    recorded = once_each(
        standalone_url, "proj.unique_limited", {*again, *set().union(*sends.values())}
    )
    assert sorted(r["args"][1] for r in recorded) == [0, 0, 0, 0, 10, 10]


def test_a_duplicate_sent_past_the_task_is_dropped_at_the_worker(
    standalone_url: str, broker: RedisServer
) -> None:
    """Two ``app.send_task`` of the same key (no producer-side check): the first takes
    the key at the worker and runs; the second, delivered while it runs, is dropped:
    never run, its result REVOKED, a log line, ``task-revoked`` and ``funnel-dropped``
    events saying so."""
    app = make_app(broker.url, standalone_url)
    events_on = '{"worker_send_task_events": true}'
    try:
        with (
            Events(app) as events,
            workers(broker.url, standalone_url, 1, FUNNEL_TEST_CONF=events_on) as started,
        ):
            started.wait_ready()
            first = app.send_task("proj.unique", ("a", 1), {"seconds": 3.0})
            wait_for(lambda: len(runs(standalone_url)) >= 1, 30)
            second = app.send_task("proj.unique", ("a", 2))
            wait_for(lambda: second.state == states.REVOKED, 30)
            assert first.get(timeout=30) == 1
            assert f"dropped task proj.unique[{second.id}]: task {first.id} holds" in (
                started.logs()
            )
            wait_for(lambda: events.of("funnel-dropped") and events.of("task-revoked"), 10)
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)  # no run can come after this
    once_each(standalone_url, "proj.unique", {first.id})
    assert [e["uuid"] for e in events.of("task-revoked")] == [second.id]
    (event,) = events.of("funnel-dropped")
    assert (event["uuid"], event["holder"]) == (second.id, first.id)
    assert (event["name"], event["funnel"]) == ("proj.unique", "funnel:{proj.unique:a}")


def test_a_sigkilled_worker_frees_the_key_within_its_lease(
    standalone_url: str, broker: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """funnel_unique_ttl=3: a run of 60 s is renewed past its TTL while it runs; its
    worker SIGKILLed, the key is free again within the TTL, and a new send runs."""
    monkeypatch.setenv("FUNNEL_TEST_UNIQUE_TTL", "3")
    app = make_app(broker.url, standalone_url)
    try:
        doomed = workers(broker.url, standalone_url, 1, FUNNEL_TEST_UNIQUE_TTL="3").start()
        try:
            doomed.wait_ready()
            held = app.tasks["proj.unique"].delay("a", 1, seconds=60).id
            wait_for(lambda: len(runs(standalone_url)) >= 1, 30)
            started = time.monotonic()
            wait_for(lambda: time.monotonic() - started > 4.5, 10)  # past one TTL: renewed
            assert holder(standalone_url) == held
            shown = celery_funnel(standalone_url, "status").stdout
            assert f"unique: funnel:{{proj.unique:a}} held by task {held}" in shown
            os.killpg(doomed.processes[0].pid, signal.SIGKILL)
            killed = time.monotonic()
        finally:
            doomed.stop()
        wait_for(lambda: holder(standalone_url) is None, 10)
        freed_after = time.monotonic() - killed
        print(f"\nkey freed {freed_after:.2f} s after the SIGKILL (TTL 3 s)")
        assert freed_after <= 3.0 + 0.5
        with workers(broker.url, standalone_url, 1, FUNNEL_TEST_UNIQUE_TTL="3"):
            again = app.tasks["proj.unique"].delay("a", 2).id
            wait_for(lambda: len(runs(standalone_url)) >= 2, 30)
    finally:
        close_app(app)
    assert again != held
    once_each(standalone_url, "proj.unique", {held, again})


@pytest.mark.parametrize("end", ["revoked", "time_limit", "expired"])
def test_the_key_is_freed_when_the_run_ends_without_succeeding(
    standalone_url: str, broker: RedisServer, end: str
) -> None:
    """A run revoked with terminate, killed by its hard time limit (a pool process
    lost: seen in the worker's main process), or a task expired before it started: its
    key is free at once (its TTL is 600 s), and a new send runs."""
    app = make_app(broker.url, standalone_url)
    task = app.tasks["proj.unique"]
    try:
        with workers(broker.url, standalone_url, 1) as started:
            started.wait_ready()
            if end == "expired":  # both pool slots busy with runs of other keys
                task.delay("b", 0, seconds=3.0)
                task.delay("c", 0, seconds=3.0)
                wait_for(lambda: len(runs(standalone_url)) >= 2, 30)
                held = task.apply_async(("a", 1), expires=1.0).id
            else:
                options = {"time_limit": 1.0} if end == "time_limit" else {}
                held = task.apply_async(("a", 1), {"seconds": 30.0}, **options).id
                wait_for(lambda: len(runs(standalone_url)) >= 1, 30)
                if end == "revoked":
                    app.control.revoke(held, terminate=True)
            assert holder(standalone_url) in (held, None)
            wait_for(lambda: holder(standalone_url) is None, 15)
            again = task.delay("a", 2).id
            assert again != held
            wait_for(lambda: any(r["id"] == again for r in runs(standalone_url)), 30)
    finally:
        close_app(app)


def test_reset_frees_the_keys_of_a_task(standalone_url: str, broker: RedisServer) -> None:
    """A task whose message was purged keeps its key until its TTL: ``celery funnel reset
    <task>`` frees it, and the next send is published."""
    app = make_app(broker.url, standalone_url)
    try:
        held = app.tasks["proj.unique"].delay("a").id
        assert app.tasks["proj.unique"].delay("a").id == held
        done = celery_funnel(standalone_url, "reset", "proj.unique", "--yes")
        assert f"  {KEY}" in done.stdout, done.stdout + done.stderr
        assert holder(standalone_url) is None
        assert app.tasks["proj.unique"].delay("a").id != held
    finally:
        close_app(app)


@pytest.mark.parametrize("park_after", ["5", "0.5"], ids=["held", "parked"])
def test_tasks_revoked_while_they_wait_free_their_keys(
    standalone_url: str, broker: RedisServer, park_after: str
) -> None:
    """8 keys at 2/s over all keys (waits up to 3.5 s: held in the worker, or parked past
    0.5 s), the last 4 revoked at once: 4 run, and every key is free again long before
    its TTL (600 s)."""
    app = make_app(broker.url, standalone_url)
    task = app.tasks["proj.unique_limited"]
    conf = f'{{"funnel_park_after": {park_after}}}'
    try:
        with workers(broker.url, standalone_url, 1, FUNNEL_TEST_CONF=conf) as started:
            started.wait_ready()
            ids = [task.delay(key).id for key in "abcdefgh"]
            with redis.Redis.from_url(standalone_url) as client:
                wait_for(lambda: len(runs(standalone_url)) >= 1, 30)  # the rest wait now
                if park_after == "0.5":
                    wait_for(lambda: ParkStore(client, "funnel:").count() >= 6, 30)
                for task_id in ids[4:]:
                    app.control.revoke(task_id)
                wait_for(lambda: not list(client.scan_iter("funnel:*#unique")), 30)
            wait_for(lambda: len(runs(standalone_url)) >= 4, 30)
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)  # no run can come after this
    once_each(standalone_url, "proj.unique_limited", set(ids[:4]))


def test_a_retry_in_its_countdown_keeps_the_key(standalone_url: str, broker: RedisServer) -> None:
    """A unique task whose run retries with a countdown of 3 s: every send of its key
    during the countdown (and while the retry runs) returns its id and runs nothing; the
    retry runs once; once it ended, the key is free and a new send runs (its first run
    and its retry, once each)."""
    app = make_app(broker.url, standalone_url)
    task = app.tasks["proj.unique_retrying"]
    key = "funnel:{proj.unique_retrying:a}#unique"
    during: list[str] = []

    def retried() -> bool:
        """One more send of the key; True once the retry ran, or a send was not
        collapsed into the first task."""
        during.append(task.delay("a", len(during) + 1).id)
        return during[-1] != first or any(r["retries"] for r in runs(standalone_url))

    try:
        with workers(broker.url, standalone_url, 1) as started:
            started.wait_ready()
            first = task.delay("a", 0).id
            wait_for(lambda: len(runs(standalone_url)) >= 1, 30)  # it retries in 3 s
            wait_for(retried, 30)  # sends from the first run to the retry's run
            during.append(task.delay("a", 999).id)  # the retry runs: it holds the key
            assert set(during) == {first}, f"{len(set(during) - {first})} sends took the key"
            with redis.Redis.from_url(standalone_url) as client:
                assert client.get(key) == first.encode()
                client.set(RELEASE, 1)
                wait_for(lambda: client.get(key) is None, 30)  # freed at the retry's end
            again = task.delay("a", 1000, countdown=0).id
            assert again != first
            wait_for(lambda: len(runs(standalone_url)) >= 4, 30)
            with redis.Redis.from_url(standalone_url) as client:
                wait_for(lambda: client.get(key) is None, 30)
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)
    recorded = [(r["id"], r["retries"], r["args"]) for r in runs(standalone_url)]
    assert recorded == [
        (first, 0, ["a", 0]), (first, 1, ["a", 0]), (again, 0, ["a", 1000]),
        (again, 1, ["a", 1000]),
    ]  # fmt: skip
