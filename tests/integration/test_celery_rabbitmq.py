"""The shared limit across two real workers on RabbitMQ (127.0.0.1:5672), classic and
quorum queues. Skipped when RabbitMQ is not there, unless CI is set: then it fails."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest
import redis
from kombu.connection import Connection
from kombu.entity import Queue

from celery_funnel._limiter.keys import task_key
from celery_funnel._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from celery_funnel.testing import CeleryWorkers, peak
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for
from tests.redis_monitor import funnel_log, one_slot_each, started_early

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.rabbitmq]
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)
ROOT = str(Path(__file__).resolve().parents[2])


def worker_env(amqp_url: str, redis_url: str, queue: str, **more: str) -> dict[str, str]:
    """The environment of the test project's workers on RabbitMQ queue ``queue``."""
    return {
        "FUNNEL_TEST_BROKER": amqp_url, "FUNNEL_TEST_REDIS": redis_url,
        "FUNNEL_TEST_QUEUE": queue, **more,
    }  # fmt: skip


def rabbit_workers(env: dict[str, str], queue: str) -> CeleryWorkers:
    """Two workers of ``tests.integration.proj`` (2 processes each) consuming ``queue``."""
    return CeleryWorkers(
        "tests.integration.proj", 2, env, "-c", "2", "-Q", queue, cwd=ROOT, prefix=f"{queue}-w"
    )


@pytest.mark.parametrize("quorum", [False, True], ids=["classic", "quorum"])
def test_two_workers_share_one_funnel_on_rabbitmq(
    amqp_url: str, redis_url: str, redis_client: redis.Redis, quorum: bool
) -> None:
    redis_client.flushall()
    queue = f"funnel-test-{uuid.uuid4().hex[:8]}"
    env = worker_env(amqp_url, redis_url, queue, FUNNEL_TEST_QUORUM="1" if quorum else "0")
    app = make_app(amqp_url, redis_url, queue=queue, quorum=quorum)
    try:
        key = task_key("funnel:", "proj.limited")
        with funnel_log(redis_url, key) as log, rabbit_workers(env, queue):
            results = [app.tasks["proj.limited"].delay(i) for i in range(20)]
            assert sorted(r.get(timeout=90) for r in results) == list(range(20))
        recorded = [r for r in runs(redis_url) if r["name"] == "proj.limited"]
        assert sorted(r["args"][0] for r in recorded) == list(range(20)), "each ran exactly once"
        # 10/s, capacity 1, read from the funnel's decisions on Redis's clock: one 0.1 s
        # slot a decision, no run before its slot. Was: <= 11 starts in any second of the
        # workers' clock (a loaded machine bunches starts that waited for the CPU)
        slots = one_slot_each(log.decisions(key), 0.1, before=log.first_tat(key))
        assert len(slots) >= 20
        assert peak(slots) <= 11
        assert started_early([r["at"] for r in recorded], slots, DEFAULT_EARLY_SECONDS) == []
    finally:
        close_app(app)
        with Connection(amqp_url) as connection:
            Queue(queue, channel=connection.channel()).delete()


def _ports_of(pids: set[int]) -> set[str]:
    """The client ports of the connections to port 5672 that processes ``pids`` hold."""
    listing = subprocess.run(
        ["ss", "-tnpH", "dport = :5672"], capture_output=True, text=True, check=True
    ).stdout
    return {
        line.split()[3].rsplit(":", 1)[1]
        for line in listing.splitlines()
        if {int(p) for p in re.findall(r"pid=(\d+)", line)} & pids
    }


def close_connections_of(pid: int) -> int:
    """Close, on the RabbitMQ side, every AMQP connection of process ``pid`` and its
    children (a cut connection, not a shutdown); others' connections are left alone.
    Returns how many were closed.

    RabbitMQ names a connection by its client's port, which another process may take
    over while rabbitmqctl starts (seconds, on a loaded machine): a port counts as the
    process's only if it was its both before and after RabbitMQ listed its connections
    (in a load run, this cut a connection 3 s old as another test's first write on a
    new RabbitMQ connection was reset: most likely a port taken over)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    pids = {pid, *(int(p) for p in children.read_text().split())} if children.exists() else {pid}
    before = _ports_of(pids)
    connections = subprocess.run(
        ["rabbitmqctl", "list_connections", "pid", "peer_port", "-q", "--no-table-headers"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    ports = before & _ports_of(pids)
    closed = 0
    for line in connections.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] in ports:
            done = subprocess.run(
                ["rabbitmqctl", "close_connection", fields[0], "celery-funnel test: cut"],
                capture_output=True, check=False, timeout=30,
            )  # fmt: skip
            closed += done.returncode == 0  # it may be gone already: its worker saw a cut
    return closed


def test_connection_cut_while_tasks_are_held_runs_each_once_on_rabbitmq(
    amqp_url: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """16 tasks through 2/s held in the worker gate; the worker's AMQP connections are
    closed by RabbitMQ while they wait: RabbitMQ delivers the un-acked ones again and
    the held copies are dropped with the connection (10 of 16 ran twice before)."""
    redis_client.flushall()
    queue = f"funnel-test-{uuid.uuid4().hex[:8]}"
    env = worker_env(amqp_url, redis_url, queue, FUNNEL_TEST_LIMITS='{"proj.plain": "2/s"}')
    app = make_app(amqp_url, redis_url, queue=queue, task_ignore_result=True)
    try:
        with CeleryWorkers(
            "tests.integration.proj", 1, env, "-c", "2", "-Q", queue, cwd=ROOT, prefix=f"{queue}-w"
        ) as w:
            w.wait_ready()
            ids = {app.tasks["proj.plain"].delay(i).id for i in range(16)}
            wait_for(lambda: len(runs(redis_url)) >= 3, 30)
            assert close_connections_of(w.processes[0].pid) >= 1
            wait_for(lambda: len({r["id"] for r in runs(redis_url)}) >= 16, 90)
            count = len(runs(redis_url))
            with pytest.raises(AssertionError):  # nothing runs a second time
                wait_for(lambda: len(runs(redis_url)) > count, 5)
            logs = w.logs()
        recorded = [r["id"] for r in runs(redis_url) if r["name"] == "proj.plain"]
        twice = {i for i in recorded if recorded.count(i) > 1}
        assert sorted(recorded) == sorted(ids), (twice, logs[-6000:])
        assert "held task(s) dropped" in logs
    finally:
        close_app(app)
        with Connection(amqp_url) as connection:
            Queue(queue, channel=connection.channel()).delete()
