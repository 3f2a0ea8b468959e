"""A copy the gate publishes again (a wait longer than the worker may hold its message,
where nothing is parked) is backed up in the parked store until a worker accepts it:
kombu's Redis transport takes a message off the queue (``BRPOP``) before it records it
as delivered, and a worker killed in between, or a broker dying, loses it. Real
``celery worker`` processes, a real Redis broker and a funnels' Redis without AOF (so
that waits are published again, not parked); the worker dies in that window, as
``tests.crash`` says, on the first copy it takes off the queue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial

import pytest
import redis

from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.proj import backups, close_app, make_app, runs
from tests.integration.test_one_gate import ROOT, once_each, send
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
# kombu records a message it took off the queue as delivered here (a pipeline to the
# broker's Redis): the worker dies before it, the message is in neither list
KOMBU_RECORDS = "kombu.transport.redis:QoS.append"
# a transport hands a message it read to Celery here: celery_funnel.transport's fetch
# recorded it as it took it
HANDED = "kombu.transport.virtual.base:Transport._deliver"
OURS = json.dumps({"broker_transport": "celery_funnel.transport:Transport"})


@pytest.fixture
def funnels() -> Iterator[RedisServer]:
    with RedisServer() as server:  # no AOF: nothing is parked, long waits are published
        yield server


def worker(broker: str, funnels: str, prefix: str, *pool: str, **env: str) -> CeleryWorkers:
    """One worker of ``proj``; 4 s visibility timeout, leases of 1 s."""
    base = {
        "FUNNEL_TEST_BROKER": broker, "FUNNEL_TEST_REDIS": funnels,
        "FUNNEL_TEST_VISIBILITY": "4", "FUNNEL_TEST_PARK_LEASE": "1", "FUNNEL_TEST_BACKUPS": "1",
    }  # fmt: skip
    return CeleryWorkers(
        "tests.integration.proj", 1, {**base, **env}, *pool, "-Q", "proj", cwd=ROOT,
        prefix=prefix,
    )  # fmt: skip


def ran(url: str, count: int) -> bool:
    return len([r for r in runs(url) if r["name"] == "proj.slow"]) >= count


def test_a_copy_lost_on_its_way_is_published_again_and_runs_once(
    broker: RedisServer, funnels: RedisServer
) -> None:
    """4 tasks of ``proj.slow`` (one start per 2 s): the later ones wait longer than the
    worker may hold them and are published again with a countdown. The worker (a solo
    pool: no run is cut) dies as it takes the first such copy off the queue. A second
    worker runs every task once: the lost copy's backup is published again when its
    claim (the countdown and a 1 s lease) is over."""
    app = make_app(broker.url, funnels.url, task_ignore_result=True)
    dying = worker(
        broker.url, funnels.url, "d", "-P", "solo",
        FUNNEL_TEST_DIE_AT=KOMBU_RECORDS, FUNNEL_TEST_DIE_IF="copy",
    )  # fmt: skip
    survivor = worker(broker.url, funnels.url, "s", "-c", "2")
    try:
        with dying:
            dying.wait_ready()
            sent = send(app, "proj.slow", 4)
            wait_for(lambda: dying.processes[0].poll() is not None, 40)
        with survivor:
            survivor.wait_ready()
            wait_for(partial(ran, funnels.url, 4), 45)
        once_each(funnels.url, "proj.slow", set(sent))
        assert backups(funnels.url)
    finally:
        close_app(app)


def test_with_the_transport_a_copy_needs_no_backup(
    broker: RedisServer, funnels: RedisServer
) -> None:
    """The same, on ``celery_funnel.transport``: the worker dies as the first copy it
    took reaches Celery; the fetch had recorded it, so no backup is kept in the funnels'
    Redis, and the broker gives the copy again after its visibility timeout: every
    task runs once."""
    app = make_app(broker.url, funnels.url, task_ignore_result=True,
                   broker_transport="celery_funnel.transport:Transport")  # fmt: skip
    ours = {"FUNNEL_TEST_CONF": OURS}
    dying = worker(
        broker.url, funnels.url, "d", "-P", "solo",
        FUNNEL_TEST_DIE_AT=HANDED, FUNNEL_TEST_DIE_IF="copy", **ours,
    )  # fmt: skip
    survivor = worker(broker.url, funnels.url, "s", "-c", "2", **ours)
    try:
        with dying:
            dying.wait_ready()
            sent = send(app, "proj.slow", 4)
            wait_for(lambda: dying.processes[0].poll() is not None, 40)
        with survivor:
            survivor.wait_ready()
            wait_for(partial(ran, funnels.url, 4), 45)
        once_each(funnels.url, "proj.slow", set(sent))
        assert backups(funnels.url) == []
    finally:
        close_app(app)


def test_a_backup_is_claimed_for_its_copy_never_due_like_a_parked_task(
    broker: RedisServer, funnels: RedisServer
) -> None:
    """4 tasks of ``proj.slow`` on one worker, nothing lost: each copy published again
    is backed up in the parked store, claimed for that copy at once, so it is never
    listed as due for a release (a releaser would publish it a second time) nor counted
    as parked; sampled over the whole run, and every task runs once."""
    app = make_app(broker.url, funnels.url, task_ignore_result=True)
    due: set[str] = set()
    counted: list[dict[str, int]] = []
    backups = 0
    try:
        with (
            worker(broker.url, funnels.url, "b", "-c", "2") as one,
            redis.Redis.from_url(funnels.url) as client,
        ):
            one.wait_ready()
            store = ParkStore(client, "funnel:")
            sent = send(app, "proj.slow", 4)

            def sampled() -> bool:
                nonlocal backups
                backups = max(backups, store.count())
                due.update(p.task_id for p in store.entries())
                counted.extend([store.counts()] if store.counts() else [])
                return ran(funnels.url, 4)

            wait_for(sampled, 60)
        once_each(funnels.url, "proj.slow", set(sent))
    finally:
        close_app(app)
    assert backups >= 1, "the copies published again were backed up"
    assert due == set(), "a backup waits claimed for its copy, not due for a release"
    assert counted == [], "nor is it counted as parked"
