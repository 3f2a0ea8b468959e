"""The broker transport with real ``celery worker`` processes on a real Redis broker:
tasks run once; a worker killed right after the fetch's reply arrived (before Celery saw
the message) loses nothing, where kombu's own transport loses the message; pidbox
replies leave no record; broadcast, ``celery purge``, ``global_keyprefix``, a broker
restart (NOSCRIPT) and warm shutdowns in the middle of a stream."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from functools import partial

import pytest
import redis

from celery_funnel.testing import RedisServer
from tests.integration.transport_proj import TransportConf, counts
from tests.integration.transport_rig import ROOT, held, producer, restoring, visible, workers
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]

# kombu hands a message it read to its consumer here: after the fetch's reply (or
# BRPOP's) arrived, before Celery saw the message
AFTER_THE_FETCH = "kombu.transport.virtual.base:Transport._deliver"


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    with RedisServer(aof=True) as server:
        yield server


@pytest.fixture
def store() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


def all_ran_once(store: str, ids: list[str], timeout: float = 90.0) -> None:
    """Every task of ``ids`` ran, none twice (a hang fails after ``timeout`` s)."""
    try:
        wait_for(lambda: set(counts(store)) >= set(ids), timeout)
    except AssertionError:
        raise AssertionError(f"not run: {sorted(set(ids) - set(counts(store)))}") from None
    twice = {task: n for task, n in counts(store).items() if n > 1}
    assert twice == {}


def test_tasks_run_once(broker: RedisServer, store: str) -> None:
    conf = TransportConf(broker.url, store, options=restoring(30))
    with producer(conf) as app, workers(conf, 2):
        ids = [app.send_task("transport.record", (n,)).id for n in range(60)]
        all_ran_once(store, ids)
        wait_for(lambda: held(broker.url) == 0)


LOSES = pytest.mark.xfail(
    strict=True, reason="kombu's own transport loses a message read but not recorded"
)


@pytest.mark.parametrize(
    "ours", [pytest.param(True, id="ours"), pytest.param(False, id="stock", marks=LOSES)]
)
def test_a_worker_killed_right_after_the_fetch_loses_nothing(
    broker: RedisServer, store: str, ours: bool
) -> None:
    """The worker dies (SIGKILL, its whole process group) the first time kombu hands a
    message it read to Celery: with the transport the message was recorded in the same
    call that took it, and the next worker runs it once after the visibility timeout.
    kombu's own transport had popped it and not recorded it yet: it is gone."""
    conf = TransportConf(broker.url, store, ours=ours, options=restoring(2))
    with producer(conf) as app:
        with workers(conf, 1, env={"FUNNEL_TEST_DIE_AT": AFTER_THE_FETCH}) as dying:
            task = app.send_task("transport.record", (1,)).id
            wait_for(lambda: all(p.poll() is not None for p in dying.processes), 60)
        assert counts(store) == {}
        visible(broker.url, 2)
        with workers(conf, 1, prefix="after"):
            wait_for(lambda: counts(store) or held(broker.url) == 0, 60)
            wait_for(lambda: held(broker.url) == 0, 60)
        assert counts(store) == {task: 1}


def test_pidbox_replies_leave_no_record_and_broadcast_reaches_all(
    broker: RedisServer, store: str
) -> None:
    """``inspect``/``ping`` broadcast to every worker (fanout, PUB/SUB as kombu has it);
    their replies come back on a queue consumed without acks, which the fetch does not
    record: nothing is left in ``unacked`` to come back later."""
    conf = TransportConf(broker.url, store)
    with producer(conf) as app, workers(conf, 2):
        for _ in range(3):
            replies = app.control.ping(timeout=5)
            assert len(replies) == 2, replies
        active = app.control.inspect(timeout=5).active_queues()
        assert active is not None
        assert len(active) == 2
        with redis.Redis.from_url(broker.url) as client:
            assert client.hlen("unacked") == 0


def test_celery_purge_empties_the_queue(broker: RedisServer, store: str) -> None:
    conf = TransportConf(broker.url, store)
    with producer(conf) as app:
        for n in range(7):
            app.send_task("transport.record", (n,))
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.transport_proj",
         "purge", "-f", "-Q", "t"],
        env={**os.environ, **conf.env()}, cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Purged 7 messages" in out.stdout, out.stdout
    assert held(broker.url) == 0


def test_global_keyprefix(broker: RedisServer, store: str) -> None:
    """Every key the transport writes carries the prefix, its markers and records too;
    a message taken by a worker killed right after the fetch comes back and runs once."""
    conf = TransportConf(broker.url, store, options=restoring(2, global_keyprefix="pfx:"))
    with producer(conf) as app:
        with workers(conf, 1, env={"FUNNEL_TEST_DIE_AT": AFTER_THE_FETCH}) as dying:
            first = app.send_task("transport.record", (0,)).id
            wait_for(lambda: all(p.poll() is not None for p in dying.processes), 60)
        with redis.Redis.from_url(broker.url) as client:
            assert client.hlen("pfx:unacked") == 1
        visible(broker.url, 2, "pfx:")
        with workers(conf, 2, prefix="after"):
            ids = [first] + [app.send_task("transport.record", (n,)).id for n in range(1, 30)]
            all_ran_once(store, ids)
            wait_for(lambda: held(broker.url, "pfx:") == 0)
    with redis.Redis.from_url(broker.url) as client:
        keys = [key.decode() for key in client.scan_iter("*")]
    assert keys
    assert [key for key in keys if not key.startswith("pfx:")] == []


def test_a_broker_restart_loses_its_scripts_not_the_tasks(broker: RedisServer, store: str) -> None:
    """The broker restarts (its AOF keeps the queue, not the script cache): the fetch
    meets NOSCRIPT, loads the script again, and every task runs once."""
    conf = TransportConf(broker.url, store, options=restoring(5))
    with producer(conf) as app, workers(conf, 2):
        ids = [app.send_task("transport.record", (n,)).id for n in range(20)]
        all_ran_once(store, ids)
        broker.kill()
        broker.start()
        ids += [app.send_task("transport.record", (n,)).id for n in range(20, 40)]
        all_ran_once(store, ids)


def test_warm_shutdowns_in_a_stream_lose_nothing(broker: RedisServer, store: str) -> None:
    """Workers stopped (SIGTERM, a warm shutdown) while tasks stream in, and replaced:
    a fetch in flight at close is read and put back, every task runs once."""
    conf = TransportConf(broker.url, store, options=restoring(30))
    with producer(conf) as app:
        ids: list[str] = []
        for round_ in range(3):
            with workers(conf, 2, prefix=f"r{round_}-"):
                ids += [app.send_task("transport.record", (n, 0.01)).id for n in range(40)]
                # stopped mid-stream: once all but 30 have run
                wait_for(partial(lambda sent: len(counts(store)) >= sent - 30, len(ids)), 60)
        with workers(conf, 1, prefix="last"):
            all_ran_once(store, ids)
