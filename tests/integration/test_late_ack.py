"""A run acked late (``acks_late``) whose worker dies after the body ended, before the
ack, runs once: its end was recorded (``_celery.late_ack``), and the message the broker
gives again is dropped by the next worker's gate. Plain Celery runs it twice. A run
killed mid-body still runs again (Celery's at-least-once). Real ``celery worker``
processes on a Redis broker (the message given again at its 4 s visibility timeout)
and on RabbitMQ (at once, as the connection dies); the worker dies as ``tests.crash``
says, in ``Request.acknowledge``, before anything is acked."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from celery_funnel._limiter.keys import parked_keys
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.proj import close_app, make_app, runs
from tests.integration.test_one_gate import ROOT
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
# where Celery acks a run acked late, in the worker's main process, after the run
ACK = "celery.worker.request:Request.acknowledge"


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest, broker: RedisServer) -> str:
    return broker.url if request.param == "redis" else str(request.getfixturevalue("amqp_url"))


@pytest.fixture
def funnels() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _runs(url: str, task_id: str) -> int:
    return sum(r["id"] == task_id for r in runs(url))


def _worker(
    broker: str, funnels: str, prefix: str, queue: str, pool: tuple[str, ...] = ("-c", "1"),
    **env: str,
) -> CeleryWorkers:  # fmt: skip
    """One worker of ``proj`` (``pool``: ``-c 1``) on ``queue``, acking late; a 4 s
    visibility timeout on a Redis broker."""
    base = {
        "FUNNEL_TEST_BROKER": broker, "FUNNEL_TEST_REDIS": funnels, "FUNNEL_TEST_QUEUE": queue,
        "FUNNEL_TEST_VISIBILITY": "4", "FUNNEL_TEST_ACKS_LATE": "1",
        # the worker gate's, far from full
        "FUNNEL_TEST_LIMITS": json.dumps({"proj.plain": {"rate": "1000/s", "capacity": 100}}),
    }  # fmt: skip
    return CeleryWorkers(
        "tests.integration.proj", 1, {**base, **env}, *pool, "-Q", queue, cwd=ROOT,
        prefix=prefix,
    )  # fmt: skip


# a FunnelTask, and a plain task under a worker-wide limit (funnel_limits)
@pytest.mark.parametrize("name", ["proj.limited", "proj.plain"])
def test_a_run_ended_before_its_late_ack_is_not_run_again(
    broker_url: str, funnels: RedisServer, name: str
) -> None:
    queue = f"late-{uuid.uuid4().hex[:8]}"
    app = make_app(broker_url, funnels.url, queue=queue, task_ignore_result=True)
    try:
        dying = _worker(broker_url, funnels.url, "d", queue, FUNNEL_TEST_DIE_AT=ACK)
        with dying:
            dying.wait_ready()
            task_id = app.tasks[name].apply_async((1,)).id
            wait_for(lambda: dying.processes[0].poll() is not None, 40)
        assert _runs(funnels.url, task_id) == 1, "the body ran, then its worker died"
        survivor = _worker(broker_url, funnels.url, "s", queue)
        with survivor:
            survivor.wait_ready()
            # the broker gives the un-acked message again; the survivor's gate drops it
            dropped = f"{task_id}]: another copy of it goes on"
            wait_for(lambda: dropped in survivor.logs() or _runs(funnels.url, task_id) > 1, 40)
            assert _runs(funnels.url, task_id) == 1, "the message given again ran again"
            after = app.tasks[name].apply_async((2,)).id  # the survivor runs on
            wait_for(lambda: _runs(funnels.url, after) == 1, 40)
        assert Counter(r["id"] for r in runs(funnels.url))[task_id] == 1, "ran once"
    finally:
        close_app(app)


def test_a_run_cut_mid_body_with_acks_late_runs_again(
    broker_url: str, funnels: RedisServer
) -> None:
    """A worker that dies in the body (``proj.dies_mid_body``'s first run) records no
    end: its message runs again on the next worker, as Celery's acks_late promises."""
    queue = f"late-{uuid.uuid4().hex[:8]}"
    app = make_app(broker_url, funnels.url, queue=queue, task_ignore_result=True)
    try:
        dying = _worker(broker_url, funnels.url, "d", queue)
        with dying:
            dying.wait_ready()
            task_id = app.tasks["proj.dies_mid_body"].apply_async((1,)).id
            wait_for(lambda: dying.processes[0].poll() is not None, 40)
        survivor = _worker(broker_url, funnels.url, "s", queue)
        with survivor:
            survivor.wait_ready()
            wait_for(lambda: _runs(funnels.url, task_id) == 2, 40)
    finally:
        close_app(app)


@pytest.mark.parametrize("pool", [("-c", "1"), ("-P", "threads", "-c", "4")])
def test_the_records_of_runs_acked_are_forgotten(
    funnels: RedisServer, broker: RedisServer, pool: tuple[str, ...]
) -> None:
    """Each run acked late records its end; once its message is acked (a Redis broker
    confirms an ack) the record goes, one call a second for all of them: 30 runs that
    never waited (a worker-wide limit far from full) leave none behind once one more run
    is acked a second later (prefork; and threads, whose acks come from several threads)."""
    queue = f"late-{uuid.uuid4().hex[:8]}"
    app = make_app(broker.url, funnels.url, queue=queue, task_ignore_result=True)
    accepted = parked_keys("funnel:").accepted
    try:
        with _worker(broker.url, funnels.url, "w", queue, pool) as one:
            one.wait_ready()
            sent = [app.tasks["proj.plain"].apply_async((n,)).id for n in range(30)]
            wait_for(lambda: all(_runs(funnels.url, i) == 1 for i in sent), 40)
            time.sleep(1.1)  # FORGET_SECONDS since the last call: the next ack forgets
            last = app.tasks["proj.plain"].apply_async((30,)).id
            wait_for(lambda: _runs(funnels.url, last) == 1, 40)
            with redis.Redis.from_url(funnels.url) as client:
                wait_for(lambda: client.hlen(accepted) == 0, 10)
    finally:
        close_app(app)
