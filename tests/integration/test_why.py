"""``celery -A proj funnel why TASK_ID`` on real ``celery worker`` processes and a real
Redis, on a Redis broker and on RabbitMQ (issue 43): one call says where a task is
(held in which worker, parked, re-published, waiting for a seat, collapsed into another
task, already run, unknown); ``celery inspect query_task`` answers ``scheduled`` for a
task the gate holds; a wait longer than ``funnel_log_waits_over`` is logged at INFO.

The project (``tests.integration.proj``) runs with ``funnel_park_after`` 60 s, so that a
30 s wait is held in the worker and an hour's wait is parked; ``proj.unique_held`` and
``proj.unique_limited`` (one run at a time per key) run until the test sets ``RELEASE``."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.entity import Queue

from celery_funnel._limiter.keys import parked_keys
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.proj import RELEASE, close_app, make_app, runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])
LIMITS = {"proj.plain": "1/30s"}


class Site:
    """An app, its worker (one, ``-c 2``) and the environment its CLI runs with."""

    def __init__(self, app: Celery, env: dict[str, str], workers: CeleryWorkers) -> None:
        self.app, self.env, self.workers = app, env, workers

    def why(self, task_id: str, *more: str) -> subprocess.CompletedProcess[str]:
        """``celery -A tests.integration.proj funnel why TASK_ID ...``, as a user runs it."""
        return why(self.env, task_id, *more)

    def answer(self, task_id: str, *more: str) -> dict[str, Any]:
        """``why --json``'s object (the command must succeed)."""
        return answer(self.env, task_id, *more)


def why(env: dict[str, str], task_id: str, *more: str) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.integration.proj funnel why TASK_ID ...`` run with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "funnel", "why",
         task_id, "--timeout", "1", *more],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**env, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def answer(env: dict[str, str], task_id: str, *more: str) -> dict[str, Any]:
    """``why --json``'s object (the command must succeed)."""
    done = why(env, task_id, "--json", *more)
    assert done.returncode == 0, (done.stdout, done.stderr)
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def site(broker_url: str, funnel_url: str, **env: str) -> Generator[Site, None, None]:
    queue = f"why-{time.time_ns()}"
    conf: dict[str, Any] = {"funnel_park_after": 60.0, "funnel_log_summary_every": 1.0}
    full = {
        "FUNNEL_TEST_BROKER": broker_url, "FUNNEL_TEST_REDIS": funnel_url,
        "FUNNEL_TEST_QUEUE": queue, "FUNNEL_TEST_LIMITS": json.dumps(LIMITS),
        "FUNNEL_TEST_CONF": json.dumps(conf), **env,
    }  # fmt: skip
    app = make_app(broker_url, funnel_url, queue=queue, funnel_limits=LIMITS, **conf)
    try:
        with CeleryWorkers(
            "tests.integration.proj", 1, full, "-c", "2", "-Q", queue, cwd=ROOT, prefix=f"{queue}-w"
        ) as workers:
            yield Site(app, full, workers)
            with redis.Redis.from_url(funnel_url) as client:
                client.set(RELEASE, 1)  # a warm shutdown waits for the runs it has
    finally:
        if broker_url.startswith("amqp"):
            with app.connection_for_write() as connection:
                Queue(queue, channel=connection.channel()).delete()
        close_app(app)


@pytest.fixture(params=["redis", "rabbitmq"])
def where(
    request: pytest.FixtureRequest, broker: RedisServer, standalone_url: str
) -> Iterator[Site]:
    url = broker.url if request.param == "redis" else request.getfixturevalue("amqp_url")
    yield from site(url, standalone_url)


def parked_ids(url: str) -> set[str]:
    with redis.Redis.from_url(url) as client:
        return {i.decode() for i in client.hkeys(parked_keys("funnel:").entries)}


def test_why_tells_where_each_task_is(where: Site, standalone_url: str) -> None:
    app, task = where.app, where.app.tasks
    # done: the first of each funnel runs at once
    first, hourly = task["proj.plain"].delay(0), task["proj.hourly"].delay(0)
    wait_for(lambda: len(runs(standalone_url)) == 2, 30)
    # held: 1 per 30 s, the second waits 30 s in the worker (under funnel_park_after)
    held = task["proj.plain"].delay(1)
    # parked: 1 per hour, the second waits an hour in the funnels' Redis
    parked = task["proj.hourly"].delay(1)
    # a seat: one run per key at a time; "k" runs until RELEASE, and a send of "k" past
    # apply_async (no unique claim in the producer) waits for its seat
    running = task["proj.unique_limited"].delay("k", hold=True)
    # collapsed: "a" runs until RELEASE; a send of "a" past apply_async is dropped
    holder = task["proj.unique_held"].delay("a")
    wait_for(lambda: {running.id, holder.id} <= {r["id"] for r in runs(standalone_url)}, 30)
    queue = app.conf.task_default_queue
    seat = app.send_task("proj.unique_limited", args=("k",), queue=queue)
    dropped = app.send_task("proj.unique_held", args=("a",), queue=queue)
    wait_for(lambda: {parked.id, seat.id} <= parked_ids(standalone_url), 30)
    # collapsed in the producer: the send of key "a" returns the holder's result
    mine = task["proj.unique_held"].apply_async(("a",), task_id="mine-" + holder.id)
    assert mine.id == holder.id

    # "a" and "k" run until RELEASE (60 s at most): the waiter and the keys first
    answer = where.answer(seat.id)
    assert answer["state"] == "waiting", answer
    assert answer["funnel"] == "proj.unique_limited", answer
    assert answer["place"] == 1, answer
    answer = where.answer("mine-" + holder.id, "--task", "proj.unique_held", "--key", "a")
    assert (answer["state"], answer["holder"]) == ("collapsed", holder.id), answer
    wait_for(lambda: dropped.state == "REVOKED", 30)
    answer = where.answer(dropped.id)
    assert (answer["state"], answer["holder"]) == ("collapsed", holder.id), answer

    answer = where.answer(held.id)
    assert answer["state"] == "held", answer
    assert answer["worker"].startswith(where.env["FUNNEL_TEST_QUEUE"] + "-w1@"), answer
    assert answer["funnel"] == "limit:proj.plain"
    assert (answer["deferrals"], answer["booked"]) == (1, True), answer
    assert answer["eta"].endswith("+00:00"), "UTC ISO"
    # Celery's own query: scheduled (it answered "ready", finished, before)
    # (asked of its worker only: other tests' workers share the RabbitMQ broadcast)
    inspect = app.control.inspect(timeout=1, destination=[answer["worker"]])
    (reply,) = (inspect.query_task(held.id) or {}).values()
    assert reply[held.id][0] == "scheduled", reply

    answer = where.answer(parked.id)
    assert answer["state"] == "parked", answer
    assert (answer["funnel"], answer["deferrals"], answer["booked"]) == ("proj.hourly", 1, True)
    assert answer["release_at"].endswith("+00:00"), answer
    assert answer["worker"] is None, answer
    text = where.why(parked.id)
    assert text.returncode == 0, text.stderr
    assert 1 <= len(text.stdout.splitlines()) <= 3, text.stdout
    assert "parked" in text.stdout, text.stdout
    assert answer["release_at"] in text.stdout, text.stdout

    answer = where.answer(hourly.id)
    assert (answer["state"], answer["result"]) == ("done", "SUCCESS"), answer
    assert answer["date_done"].endswith("+00:00")
    assert where.answer(first.id)["state"] == "done"

    unknown = where.why("no-such-task")
    assert unknown.returncode == 1
    assert unknown.stdout.count("\n") == 1, unknown.stdout
    assert "unknown" in unknown.stdout, unknown.stdout
    assert json.loads(where.why("no-such-task", "--json").stdout)["state"] == "unknown"

    # the INFO line of each wait over funnel_log_waits_over (5 s): the held, the parked
    logs = where.workers.logs()
    line = rf"task proj.plain\[{held.id}\] waits (\d+\.\d) s for limit:proj.plain \(held\)"
    assert 25 < float(re.findall(line, logs)[0]) <= 30, logs[-3000:]
    line = rf"task proj.hourly\[{parked.id}\] waits (\d+\.\d) s for proj.hourly \(parked\)"
    assert 3500 < float(re.findall(line, logs)[0]) <= 3600, logs[-3000:]
    # the summary, a line per funnel each second (funnel_log_summary_every): the held
    # task in its worker, the parked one in the funnels' Redis
    assert re.search(r"funnel limit:proj.plain: 1 held in this worker; the next due at", logs)
    assert "funnel proj.hourly: 1 parked" in logs, logs[-3000:]


@pytest.fixture
def no_aof() -> Iterator[RedisServer]:
    """A Redis without AOF: where "auto" parks nothing (a test's funnels' Redis)."""
    with RedisServer() as server:
        yield server


@pytest.mark.parametrize("park", ["0", "auto"], ids=["parking off", "a copy backed up"])
def test_why_tells_a_republished_task(
    broker: RedisServer, standalone_url: str, no_aof: RedisServer, park: str
) -> None:
    """Parking off (``funnel_park`` False, or "auto" on a funnels' Redis without AOF),
    countdowns capped at 1 s: a task that waits 30 s is published again with a
    countdown, and a worker holds it as an ETA task. Where copies are backed up
    (``funnel_park`` not False), the backup in the funnels' Redis does not pass for a
    parked task."""
    conf = json.dumps({"funnel_park_after": 60.0, "funnel_max_countdown": 1.0})
    if park == "0":
        funnels, parking = standalone_url, {"FUNNEL_TEST_PARK": "0"}
    else:
        funnels, parking = no_aof.url, {}
    found = site(broker.url, funnels, FUNNEL_TEST_CONF=conf, **parking)
    with contextlib.closing(found) as sites:
        republishing = next(sites)
        task = republishing.app.tasks["proj.plain"]
        # no results: a result kept subscribes on the funnels' Redis, which (no_aof)
        # stops before this test's results are let go
        task.apply_async((0,), ignore_result=True)
        waiting = task.apply_async((1,), ignore_result=True)
        seen: list[dict[str, Any]] = []

        def republished() -> bool:
            seen.append(republishing.answer(waiting.id))
            return bool(seen[-1]["state"] == "republished" and seen[-1]["worker"])

        wait_for(republished, 30)
        answer = seen[-1]
        assert answer["worker"], answer
        assert answer["eta"].endswith("+00:00"), answer
        assert answer["deferrals"] >= 1, answer
        assert {s["state"] for s in seen} <= {"held", "republished"}, seen
        assert "(republished)" in republishing.workers.logs()


def test_why_with_task_and_key_never_says_the_holder_collapsed_into_itself(
    standalone_url: str,
) -> None:
    """``why --task --key`` finds what a send collapsed into from the key's holder: asked
    of the holder itself (sent, its claim taken in the producer, not yet taken by any
    worker: nothing else knows it), the answer is not "collapsed into" itself; asked of
    a send that did collapse, it names the holder."""
    queue = f"why-{time.time_ns()}"  # no worker consumes it: the holder stays queued
    env = {
        "FUNNEL_TEST_BROKER": standalone_url, "FUNNEL_TEST_REDIS": standalone_url,
        "FUNNEL_TEST_QUEUE": queue,
    }  # fmt: skip
    app = make_app(standalone_url, standalone_url, queue=queue)
    try:
        holder = app.tasks["proj.unique_held"].delay("solo")
        again = app.tasks["proj.unique_held"].apply_async(("solo",), task_id="again-1")
        assert again.id == holder.id, "the second send collapsed in the producer"
        asked = ("--task", "proj.unique_held", "--key", "solo")
        done = why(env, holder.id, "--json", *asked)  # unknown: exit status 1
        found = json.loads(done.stdout)
        assert found["state"] != "collapsed", found
        assert found.get("holder") is None, found
        found = answer(env, "again-1", *asked)
        assert (found["state"], found["holder"]) == ("collapsed", holder.id), found
    finally:
        close_app(app)
