"""A task parked to wait in a queue (a concurrency funnel's waiters, a fair funnel's
tenant queue) is parked and queued in two calls: a worker killed between the two must
not leave it parked for the hour its entry waits when nobody queues it. Real ``celery
worker`` processes on a real Redis with AOF (parking on); the worker dies where
``tests.crash`` says, as a SIGKILL would end it, and a second worker started after it
finds the task and runs it once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_funnel._limiter.keys import task_key
from celery_funnel._stores.concurrency import ConcurrencyFunnel, ConcurrencyStore
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.fair_proj import fair_runs, make_fair_app
from tests.integration.lease_proj import ENDS, STARTS
from tests.integration.lease_proj import make_app as make_lease_app
from tests.integration.proj import close_app
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])
PREFIX = "funnel:"
LEASES, FAIR = "tests.integration.lease_proj", "tests.integration.fair_proj"
LEASES, FAIR = "tests.integration.lease_proj", "tests.integration.fair_proj"
# the point of each crash: after the task's entry is parked (and before its message is
# acked), before it is queued
BEFORE_A_SEAT_QUEUE = "celery_funnel._gate.concurrency:Concurrency.queue"
BEFORE_A_TENANT_QUEUE = "celery_funnel._shared.fair:Queues.queue"
# the entry waits QUEUE_GRACE_SECONDS (10 s) when its queueing never came; a releaser's
# pass, the broker's redelivery of what the dead worker held (5 s) and the run on top
FOUND_WITHIN = 45.0


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(aof=True) as started:  # parking is on where AOF is
        yield started


def group(
    module: str, url: str, queue: str, prefix: str, pool: str = "prefork", **env: str
) -> CeleryWorkers:
    """One worker of ``module`` (``pool``, two slots) consuming ``queue``, with a 5 s
    visibility timeout."""
    base = {
        "FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url, "FUNNEL_TEST_QUEUE": queue,
        "FUNNEL_TEST_VISIBILITY": "5",
    }  # fmt: skip
    options = ("-P", pool, "-c", "2", "-Q", queue)
    return CeleryWorkers(module, 1, {**base, **env}, *options, cwd=ROOT, prefix=prefix)


def ids(client: redis.Redis, records: str) -> list[str]:
    """The task ids of the runs ``lease_proj`` recorded in list ``records``."""
    return [json.loads(r)["id"] for r in client.lrange(records, 0, -1)]


def test_a_waiter_whose_worker_died_before_queueing_it_runs_once(server: RedisServer) -> None:
    """The only seat of ``leases.ends`` is held; the task sent waits for it, and its
    worker dies between parking it and queueing it. The seat is given back; a second
    worker runs the task once."""
    url, client = server.url, redis.Redis.from_url(server.url)
    seat = [ConcurrencyFunnel(1, task_key(PREFIX, "leases.ends"), "leases.ends")]
    leases = ConcurrencyStore(client, PREFIX, 300.0)
    held, _ = leases.take(seat, "someone", "the test")
    assert held is not None
    app = make_lease_app(url, url, "q")
    dying = group(LEASES, url, "q", "d", FUNNEL_TEST_DIE_AT=BEFORE_A_SEAT_QUEUE)
    survivor = group(LEASES, url, "q", "s")
    try:
        with dying:
            dying.wait_ready()
            # no result: a result kept subscribes, and outlives this test's server
            waiter = app.send_task("leases.ends", ("success",), ignore_result=True)
            wait_for(lambda: dying.processes[0].poll() is not None, 30)
        assert ParkStore(client, PREFIX).count() == 1, "it died with the task parked"
        leases.free(seat, "someone", held.token)
        with survivor:
            survivor.wait_ready()
            wait_for(lambda: ids(client, ENDS) == [waiter.id], FOUND_WITHIN)
            assert ids(client, STARTS) == [waiter.id], "once"
    finally:
        close_app(app)
        client.close()


def test_a_fair_task_whose_worker_died_before_queueing_it_runs_once(server: RedisServer) -> None:
    """40 tasks of one tenant on a 20/s fair funnel: those past the first slots wait in
    the tenant's queue, and the worker dies between parking the first of them and
    queueing it. A second worker runs all 40, each once."""
    url, client = server.url, redis.Redis.from_url(server.url)
    app = make_fair_app(url, url)
    # the solo pool runs each admitted task in the worker's own thread, acked before it
    # runs and before the next message is decided: the crash never cuts a run (a prefork
    # run cut before its early ack, its pool's word on its way, runs again: Celery's)
    dying = group(FAIR, url, "fair", "d", "solo", FUNNEL_TEST_DIE_AT=BEFORE_A_TENANT_QUEUE)
    survivor = group(FAIR, url, "fair", "s")
    task = app.tasks["fair.shared"]
    try:
        with dying:
            dying.wait_ready()
            for n in range(40):
                task.apply_async(("A", n), ignore_result=True)
            wait_for(lambda: dying.processes[0].poll() is not None, 30)
        assert ParkStore(client, PREFIX).count() >= 1, "it died with a task parked"
        with survivor:
            survivor.wait_ready()
            wait_for(lambda: len(fair_runs(url, "fair.shared")) >= 40, FOUND_WITHIN)
            ran = sorted(r["n"] for r in fair_runs(url, "fair.shared"))
            assert ran == list(range(40)), "each ran once"
    finally:
        close_app(app)
        client.close()
