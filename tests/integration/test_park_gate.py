"""Parked tasks through the gate, on real ``celery worker`` processes: a long wait costs
one re-queue, the rate holds, nothing is lost or run twice; a releasing worker killed
mid-release loses nothing and runs nothing twice; a parked backlog survives a restart of
the funnels' Redis (with AOF)."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
import redis
from kombu.connection import Connection
from kombu.entity import Queue

from celery_funnel._limiter.keys import limit_key, task_key
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import CeleryWorkers, RedisServer, peak
from tests.integration.conftest import nothing_left
from tests.integration.proj import close_app, make_app, runs
from tests.integration.test_celery_rabbitmq import rabbit_workers
from tests.integration.test_faults import wait_for_all
from tests.integration.test_one_gate import (
    LONG_WAITS,
    ROOT,
    long_wait_run,
    once_each,
    rate,
    send,
    workers,
)
from tests.polling import wait_for
from tests.redis_monitor import (
    FunnelLog,
    booked_again_early,
    funnel_log,
    one_slot_each,
    started_early,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@LONG_WAITS
def test_a_long_wait_costs_one_requeue(
    standalone_url: str, broker: RedisServer, task: str, env: dict[str, str]
) -> None:
    """60 tasks through 3/s with a 4 s visibility timeout: waits up to 20 s, ten times
    the countdown cap. Parked, each deferred task is published once (5.3 without)."""
    key = limit_key("funnel:", task) if "FUNNEL_TEST_LIMITS" in env else task_key("funnel:", task)
    with funnel_log(standalone_url, key) as log:
        _, recorded, requeues = long_wait_run(broker.url, standalone_url, task, 2, env)
    deferred = [r for r in recorded if r["deferrals"]]
    starts = [r["at"] for r in recorded]
    print(f"\n{task}: {requeues} re-queues for {len(deferred)} deferred tasks,"
          f" {rate(starts):.3f}/s, peak {peak(starts)}")  # fmt: skip
    assert requeues / len(deferred) <= 1.05
    rate_held(log, key, starts, 3)
    with redis.Redis.from_url(standalone_url) as client:
        assert ParkStore(client, "funnel:").count() == 0


def rate_held(log: FunnelLog, key: str, starts: list[float], limit: int) -> None:
    """The ``limit``/s funnel ``key`` (capacity 1) held, read from its decisions on
    Redis's clock: each one slot, no run before its slot, at most ``limit`` + 1 slots in
    any second, and a slot booked again only by a task back after its slot's late grace
    (a slot wasted otherwise). Was: starts at the limit +- 5 % and at most ``limit`` + 1
    in any second of the workers' clock (how fast a loaded machine started them)."""
    writes = log.decisions(key)
    slots = one_slot_each(writes, 1 / limit, before=log.first_tat(key))
    early = max(float(w.argv(4)) for w in writes) / 1e6  # the early grace reserve.lua used
    assert len(slots) >= len(starts), "a decision for each run"
    assert peak(slots) <= limit + 1
    assert started_early(starts, slots, early) == [], "a run before its slot"
    assert booked_again_early(writes, 1 / limit) == [], "booked again while it could redeem"


def worker(env: dict[str, str], prefix: str, queue: str = "proj") -> CeleryWorkers:
    return CeleryWorkers(
        "tests.integration.proj", 1, env, "-c", "2", "-Q", queue, cwd=ROOT, prefix=prefix
    )


def ran_at_least(url: str, count: int) -> bool:
    return len(runs(url)) >= count


def test_a_releasing_worker_killed_mid_release_loses_nothing_and_runs_nothing_twice(
    standalone_url: str, broker: RedisServer
) -> None:
    """400 tasks through one 10/s funnel, most of them parked. Two workers release
    them; one also runs them, the other only releases (it consumes a queue nobody
    sends to) and is SIGKILLed (with its pool) and started again, 20 times, while it
    releases. Leases last 1 s. Killing a worker that runs tasks loses or repeats what it
    was running (Celery's acks), which is not what this test is about."""
    env = {
        "FUNNEL_TEST_BROKER": broker.url, "FUNNEL_TEST_REDIS": standalone_url,
        "FUNNEL_TEST_RATE": "10/s", "FUNNEL_TEST_PARK_LEASE": "1",
    }  # fmt: skip
    rng = random.Random(20)
    app = make_app(broker.url, standalone_url, task_ignore_result=True)
    runner, releaser = worker(env, "run-"), worker(env, "rel-", queue="nobody")
    try:
        for group in (runner, releaser):
            group.start()
            group.wait_ready()
        sent = send(app, "proj.steady", 400)
        for round_ in range(20):
            # a random moment of its release loop (a release every 0.1 s, each a claim,
            # a publish and a done)
            time.sleep(rng.uniform(0.0, 0.5))
            os.killpg(releaser.processes[0].pid, signal.SIGKILL)  # worker and pool
            releaser.stop()
            releaser = worker(env, f"rel{round_}-", queue="nobody")
            releaser.start()
            releaser.wait_ready()
        wait_for(partial(ran_at_least, standalone_url, 400), 120)
    finally:
        runner.stop()
        releaser.stop()
        close_app(app)
    recorded = once_each(standalone_url, "proj.steady", set(sent))
    assert sum(1 for r in recorded if r["deferrals"]) > 300, "most were parked"


@pytest.mark.timeout(600)  # past the hang detector's 300 s: it says what was pending
def test_a_parked_backlog_survives_a_restart_of_the_funnels_redis(
    broker: RedisServer, standalone_url: str
) -> None:
    """40 tasks through 4/s, half of them parked, in a funnels' Redis with AOF (fsync
    always): SIGKILL it while they wait and start it again; every task runs once. The
    runs are recorded in a Redis of their own: a run admitted just before the SIGKILL
    would write its record to a Redis that is down, and fail once the outage outlasts
    redis-py's retries (a few seconds, on a loaded machine)."""
    with RedisServer(None, None, "--appendonly", "yes", "--appendfsync", "always") as funnels:
        app = make_app(broker.url, funnels.url, task_ignore_result=True, store_url=standalone_url)
        with workers(
            broker.url, funnels.url, 1, FUNNEL_TEST_RATE="4/s", FUNNEL_TEST_STORE=standalone_url
        ) as started:
            started.wait_ready()
            sent = send(app, "proj.steady", 40)
            with redis.Redis.from_url(funnels.url) as client:
                parked = ParkStore(client, "funnel:")
                wait_for(lambda: parked.count() >= 10, 30)
                funnels.kill()
                funnels.start()
                # a hang, not a speed: 10 s of work at 4/s, a loaded machine took 94 s;
                # it names what never ran, with the workers' log lines on it
                wait_for_all(standalone_url, started, list(sent), 300)
        close_app(app)
        once_each(standalone_url, "proj.steady", set(sent))


@pytest.mark.rabbitmq
@pytest.mark.parametrize("quorum", [False, True], ids=["classic", "quorum"])
def test_parked_tasks_are_released_to_their_rabbitmq_queue(
    amqp_url: str, standalone_url: str, quorum: bool
) -> None:
    """30 tasks through 3/s on RabbitMQ (waits up to 10 s: most parked): released to the
    queue they were sent to (a topic exchange for the quorum queue), each once, one
    re-queue per deferred task, at the funnel's rate."""
    queue = f"funnel-park-{uuid.uuid4().hex[:8]}"
    env = {
        "FUNNEL_TEST_BROKER": amqp_url, "FUNNEL_TEST_REDIS": standalone_url,
        "FUNNEL_TEST_QUEUE": queue, "FUNNEL_TEST_QUORUM": "1" if quorum else "0",
        "FUNNEL_TEST_RATE": "3/s",
    }  # fmt: skip
    app = make_app(amqp_url, standalone_url, queue=queue, quorum=quorum, task_ignore_result=True)
    try:
        key = task_key("funnel:", "proj.steady")
        with funnel_log(standalone_url, key) as log, rabbit_workers(env, queue):
            sent = send(app, "proj.steady", 30)
            wait_for(partial(ran_at_least, standalone_url, 30), 90)
        recorded = once_each(standalone_url, "proj.steady", set(sent))
    finally:
        close_app(app)
        with Connection(amqp_url) as connection:
            Queue(queue, channel=connection.channel()).delete()
    deferred = [r for r in recorded if r["deferrals"]]
    parked = [r for r in recorded if r["requeues"]]
    assert len(parked) >= 10, "waits past 5 s were parked"
    assert sum(r["requeues"] for r in recorded) / len(deferred) <= 1.05
    rate_held(log, key, [r["at"] for r in recorded], 3)


def test_a_retry_of_a_released_task_under_funnel_limits_is_parked_again_and_runs(
    standalone_url: str, broker: RedisServer
) -> None:
    """A plain task (no FunnelTask) limited only by ``funnel_limits``, 1 per 3 s, waits
    past 0.5 s parked: of two sent at once from a run, the second is parked and
    released; each run retries at once, and the retries wait parked in turn. A retry is
    sent as its task was (same id, same parent): the second's retry keeps the token of
    the release its run came from, so it is not taken for a stale copy of that run
    (dropped, never run): 4 runs, each once."""
    env = {
        "FUNNEL_TEST_LIMITS": '{"proj.plain_retrying": "1/3s"}',
        "FUNNEL_TEST_CONF": '{"funnel_park_after": 0.5}',
    }
    app = make_app(broker.url, standalone_url, task_ignore_result=True)
    try:
        with workers(broker.url, standalone_url, 1, **env) as started:
            started.wait_ready()
            app.tasks["proj.send_plain_retrying"].delay(2)
            with redis.Redis.from_url(standalone_url) as client:
                store = ParkStore(client, "funnel:")
                wait_for(lambda: store.count() >= 1, 30)  # the second waits parked
            wait_for(lambda: len(retrying_runs(standalone_url)) >= 4 or STALE in started.logs(), 60)
            assert STALE not in started.logs()
    finally:
        close_app(app)
    nothing_left(broker.url, standalone_url)  # no run can come after this
    recorded = sorted((r["at"], r["id"], r["retries"], r["deferrals"])
                      for r in retrying_runs(standalone_url))  # fmt: skip
    first, second = recorded[0][1], next(i for _, i, _, _ in recorded if i != recorded[0][1])
    assert sorted((i, retries) for _, i, retries, _ in recorded) == sorted(
        (i, retries) for i in (first, second) for retries in (0, 1)
    )
    # the second's run came from a release (it waited), and so did its retry
    assert all(deferrals for _, i, _, deferrals in recorded if i == second), recorded


STALE = "is a stale copy (another copy goes on): dropped"


def retrying_runs(url: str) -> list[dict[str, Any]]:
    return [r for r in runs(url) if r["name"] == "proj.plain_retrying"]
