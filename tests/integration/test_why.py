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
KEY_A = "funnel:{proj.unique_held:a}"  # the unique key of proj.unique_held("a")


class Site:
    """An app, its worker (one, ``-c 2``) and the environment its CLI runs with."""

    def __init__(self, app: Celery, env: dict[str, str], workers: CeleryWorkers) -> None:
        self.app, self.env, self.workers = app, env, workers

    def why(self, *args: str, deadline: float = 60) -> subprocess.CompletedProcess[str]:
        """``celery -A tests.integration.proj funnel why ARGS``, as a user runs it."""
        return why(self.env, *args, deadline=deadline)

    def answer(self, *args: str) -> dict[str, Any]:
        """``why --json``'s object (the command must succeed)."""
        return answer(self.env, *args)


def answer(env: dict[str, str], *args: str) -> dict[str, Any]:
    """``why --json``'s object, run with ``env`` (the command must succeed)."""
    done = why(env, *args, "--json")
    assert done.returncode == 0, (done.stdout, done.stderr)
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def why(env: dict[str, str], *args: str, deadline: float = 60) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.integration.proj funnel why ARGS`` (``--timeout 1`` unless
    ARGS say otherwise), in ``env``; ``deadline``: a hang."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "funnel", "why",
         "--timeout", "1", *args],
        capture_output=True, text=True, timeout=deadline, cwd=ROOT, check=False,
        env={**env, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


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
    # the held task waits 10 minutes (held up to funnel_park_after): the test's many
    # commands take a loaded machine past a shorter wait, and the task runs meanwhile
    conf = json.dumps({"funnel_park_after": 900.0, "funnel_log_summary_every": 1.0})
    limits = json.dumps({"proj.plain": "1/600s"})
    yield from site(url, standalone_url, FUNNEL_TEST_CONF=conf, FUNNEL_TEST_LIMITS=limits)


def parked_ids(url: str) -> set[str]:
    with redis.Redis.from_url(url) as client:
        return {i.decode() for i in client.hkeys(parked_keys("funnel:").entries)}


def test_why_tells_where_each_task_is(where: Site, standalone_url: str) -> None:
    app, task = where.app, where.app.tasks
    # done: the first of each funnel runs at once
    first, hourly = task["proj.plain"].delay(0), task["proj.hourly"].delay(0)
    wait_for(lambda: len(runs(standalone_url)) == 2, 30)
    # held: 1 per 10 minutes, the second waits in the worker (under funnel_park_after)
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
    # docs/operations.md's sample is this answer, its names and times put back
    shown = where.why(held.id).stdout
    for real, sample in [
        (held.id, "5b3e..."), (answer["worker"], "w1@vm"),
        (answer["eta"], "2026-11-25T04:58:35.120+00:00"), ("limit:proj.plain", "tasks.call_api"),
        ("proj.plain", "tasks.call_api"),
    ]:  # fmt: skip
        shown = shown.replace(real, sample)
    docs = (Path(ROOT) / "docs" / "operations.md").read_text()
    assert f"$ celery -A tasks funnel why 5b3e...\n{shown}```" in docs, shown

    # by the key alone: a collapsed send returned the holder's id, none of its own
    answer = where.answer("--task", "proj.unique_held", "--key", "a")
    assert (answer["task_id"], answer["state"]) == (holder.id, "running"), answer
    assert (answer["task"], answer["unique_key"]) == ("proj.unique_held", KEY_A)
    by_key = where.why("--task", "proj.unique_held", "--key", "a").stdout
    assert by_key.startswith(f"unique key {KEY_A} held by task proj.unique_held[{holder.id}]")
    nobody = where.why("--task", "proj.unique_held", "--key", "b")
    assert nobody.returncode == 1
    assert "no task holds it" in nobody.stdout, nobody.stdout
    assert where.why("--task", "proj.unique_held").returncode == 2, "TASK_ID, or --task and --key"

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

    # the workers that write their live state are asked, and their replies awaited
    # until they all came: not for --timeout (two broadcasts, asked twice when unknown)
    unknown = where.why("no-such-task", "--timeout", "60", deadline=50)
    assert unknown.returncode == 1
    assert unknown.stdout.count("\n") == 1, unknown.stdout
    assert "unknown" in unknown.stdout, unknown.stdout
    assert json.loads(where.why("no-such-task", "--json").stdout)["state"] == "unknown"

    # the INFO line of each wait over funnel_log_waits_over (5 s): the held, the parked
    logs = where.workers.logs()
    line = rf"task proj.plain\[{held.id}\] waits (\d+\.\d) s for limit:proj.plain \(held\)"
    # its slot less the time since the first run (seconds here, minutes at most on a
    # loaded machine; was 5 s of a 30 s wait)
    assert 300 < float(re.findall(line, logs)[0]) <= 600, logs[-3000:]
    line = rf"task proj.hourly\[{parked.id}\] waits (\d+\.\d) s for proj.hourly \(parked\)"
    assert 3300 < float(re.findall(line, logs)[0]) <= 3600, logs[-3000:]
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


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest, broker: RedisServer) -> str:
    if request.param == "redis":
        return broker.url
    url: str = request.getfixturevalue("amqp_url")  # skipped without it, unless CI is set
    return url


def test_why_tells_a_queued_task_from_a_wrong_id(broker_url: str, standalone_url: str) -> None:
    """No worker takes the queue up (issue 55, item 4): a task sent waits in the broker.
    Both answered ``unknown``. A Redis broker is searched: the task is ``queued`` there,
    a wrong id is not among its messages; RabbitMQ cannot be searched without taking the
    messages: the answer stays ``unknown`` and says how many wait, and once the queue
    is empty, that the id is wrong."""
    queue = f"why-{time.time_ns()}"
    env = {"FUNNEL_TEST_BROKER": broker_url, "FUNNEL_TEST_REDIS": standalone_url,
           "FUNNEL_TEST_QUEUE": queue}  # fmt: skip
    app = make_app(broker_url, standalone_url, queue=queue, task_ignore_result=True)
    try:
        with app.connection_for_write() as connection:  # declared, as a worker would
            Queue(queue, channel=connection.channel()).declare()
        sent = app.tasks["proj.limited"].delay(1)
        found, wrong = why(env, sent.id, "--json"), why(env, "no-such-task")
        assert wrong.returncode == 1, wrong.stdout
        if broker_url.startswith("redis"):
            assert found.returncode == 0, (found.stdout, found.stderr)
            answer = json.loads(found.stdout)
            assert (answer["state"], answer["queue"]) == ("queued", queue), answer
            assert "not among the broker's messages: a wrong id?" in wrong.stdout, wrong.stdout
        else:
            assert found.returncode == 1, found.stdout
            answer = json.loads(found.stdout)
            assert answer["state"] == "unknown", answer
            maybe = "the broker cannot be searched: it may be among the messages waiting"
            assert f"{maybe} in its queues (1 in {queue})" in answer["where"], answer
            with app.connection_for_write() as connection:
                Queue(queue, channel=connection.channel()).purge()
            emptied = why(env, sent.id)
            assert emptied.returncode == 1
            assert (
                f"no message waits in the app's queues (0 in {queue}): a wrong id?"
                in emptied.stdout
            )
    finally:
        if not broker_url.startswith("redis"):
            with app.connection_for_write() as connection:
                Queue(queue, channel=connection.channel()).delete()
        close_app(app)


def test_why_follows_a_republished_task_back_to_the_broker_and_names_it(
    broker_url: str, standalone_url: str
) -> None:
    """Parking off, countdowns capped at 1 s (issue 55, item 4): a republished task's
    answer names its funnel (it named none); with the workers' consumer cancelled, its
    next copy waits in the broker: ``queued``, on both brokers (it was ``unknown``);
    once run, ``done`` names the task (from the copies' record: no ``result_extended``).
    ``proj.plain`` runs 1 per 30 s: the third waits a minute, time for the command to
    see it on a loaded machine."""
    conf = json.dumps({"funnel_park_after": 60.0, "funnel_max_countdown": 1.0})
    found = site(broker_url, standalone_url, FUNNEL_TEST_CONF=conf, FUNNEL_TEST_PARK="0")
    with contextlib.closing(found) as sites:
        here = next(sites)
        app, queue = here.app, here.env["FUNNEL_TEST_QUEUE"]
        sent = [app.tasks["proj.plain"].delay(n) for n in range(3)]  # at 0, 30 and 60 s
        seen: list[dict[str, Any]] = []

        def state(wanted: str) -> bool:
            seen.append(here.answer(sent[2].id))
            return bool(seen[-1]["state"] == wanted)

        wait_for(lambda: state("republished"), 40)
        assert seen[-1]["funnel"] == "limit:proj.plain", seen[-1]
        assert "with a countdown by funnel limit:proj.plain" in seen[-1]["where"], seen[-1]
        (worker,) = {s["worker"] for s in seen if s["worker"]}
        app.control.cancel_consumer(queue, destination=[worker], reply=True)
        wait_for(lambda: state("queued"), 40)
        assert seen[-1]["task"] == "proj.plain", seen[-1]
        app.control.add_consumer(queue, destination=[worker], reply=True)
        assert [r.get(timeout=120) for r in sent] == [0, 1, 2]
        done = here.answer(sent[2].id)
        assert (done["state"], done["task"]) == ("done", "proj.plain"), done
