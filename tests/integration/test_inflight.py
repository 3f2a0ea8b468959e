"""Decisions in flight (``_inflight``): the worker gate sends a decision's script
without waiting, and kombu's event loop reads the reply. On a real Redis and kombu's
own Hub: the replies decide as waiting for them would; an error reply (a flushed
script) and a killed connection send the waiting requests the ordinary way. On real
workers: every task runs once while the funnels' scripts are flushed and the gate's
connections killed over and over."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import redis
from kombu.asynchronous import Hub
from redis.exceptions import NoScriptError

from celery_funnel import Decision, Funnel, Limit, Rate, RedisFunnel
from celery_funnel._config.runtime import runtime_for
from celery_funnel._gate import inflight_connection as _inflight
from celery_funnel._gate.inflight import STAND_IN, InFlightDecisions
from celery_funnel._gate.inflight_connection import InFlight
from celery_funnel._limiter.keys import tickets_key
from celery_funnel._shared.charges import Charge
from celery_funnel._shared.judge import Ruling, Subject, judge
from celery_funnel._shared.live import live_for
from celery_funnel._shared.state import State
from celery_funnel.testing import RedisServer
from tests.integration.proj import close_app, make_app, runs
from tests.integration.test_one_gate import once_each, send, workers
from tests.polling import wait_for

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)
NOW = 1_700_000_000.0
# a connection lost: redis-py's error, or the socket's own (a reset, read by _lean)
LOST = (redis.exceptions.ConnectionError, ConnectionError)


@pytest.fixture(params=["lean", "redis-py"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the replies are read: straight off the socket by hiredis (``_lean``, where
    it can be), or through redis-py's connection."""
    if request.param == "redis-py":
        monkeypatch.setattr(_inflight, "lean", lambda connection: None)
    return str(request.param)


def assert_way(inflight: InFlight, way: str) -> None:
    assert (inflight.lean is not None) == (way == "lean"), "the way to read replies"


@pytest.fixture
def hub() -> Iterator[Hub]:
    loop = Hub()
    yield loop
    loop.close()


def spin(hub: Hub, done: Callable[[], bool], timeout: float = 10) -> None:
    """Run the event loop until ``done()``."""
    loop = hub.create_loop()
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the event loop never delivered the replies"
        next(loop)


def decisions(n: int) -> list[Callable[[Funnel], Any]]:
    return [partial(_decision, i=i) for i in range(n)]


def _decision(funnel: Funnel, i: int) -> Decision:
    return funnel.throttle(f"{{t}}:{i % 3}", 2, 10, 1, now=NOW + i * 0.01)


@pytest.mark.parametrize("protocol", [2, 3])
def test_replies_read_by_the_event_loop_decide_as_waiting_would(
    redis_url: str, hub: Hub, redis_client: redis.Redis, way: str, protocol: int
) -> None:
    redis_funnel = RedisFunnel.from_url(redis_url, socket_timeout=5, protocol=protocol)
    redis_funnel.throttle("{t}:load", 1, 1, 1)  # the script loaded
    redis_client.flushall()
    got: dict[int, Decision] = {}
    inflight = InFlight(lambda: redis_funnel, hub)
    assert inflight.on

    def resume(i: int, decide: Callable[[Funnel], Any], reply: Any) -> None:
        got[i] = decide(inflight.replay(reply, redis_funnel._eval))

    for i, decide in enumerate(decisions(30)):
        call, _ = inflight.capture(decide)
        assert call is not None
        inflight.send(call, partial(resume, i, decide))
    assert_way(inflight, way)
    spin(hub, lambda: len(got) == 30)
    redis_client.flushall()
    assert [got[i] for i in range(30)] == [decide(redis_funnel) for decide in decisions(30)]
    assert any(d.limited for d in got.values())
    assert not all(d.limited for d in got.values())
    inflight.close()
    redis_funnel.client.close()


def test_an_error_reply_and_a_killed_connection_resume_every_waiting_request(
    redis_funnel: RedisFunnel, hub: Hub, redis_client: redis.Redis, way: str
) -> None:
    got: list[Any] = []
    inflight = InFlight(lambda: redis_funnel, hub)
    decide = decisions(1)[0]
    call, _ = inflight.capture(decide)
    assert call is not None
    redis_client.script_flush()
    inflight.send(call, got.append)
    assert_way(inflight, way)
    spin(hub, lambda: len(got) == 1)
    assert isinstance(got[0], NoScriptError)
    redis_funnel.throttle("{t}:load", 1, 1, 1)  # loads the script again
    for _ in range(5):
        inflight.send(call, got.append)
    redis_client.client_kill_filter(_type="normal", skipme=True)
    spin(hub, lambda: len(got) == 6)
    # replies come back in the order the calls went out: those read before the kill,
    # then the lost connection for every call still waiting on it
    read = list(itertools.takewhile(lambda r: isinstance(r, (list, int)), got[1:]))
    lost = got[1 + len(read) :]
    assert all(isinstance(r, LOST) for r in lost), got[1:]
    decided = [decide(inflight.replay(r, redis_funnel._eval)) for r in read]
    assert all(isinstance(d, Decision) for d in decided), decided
    # one `now` for every call: once one is refused, the rest are
    assert [d.limited for d in decided] == sorted(d.limited for d in decided), decided
    # the first call after the kill may go out on the dead connection and come back
    # as a ConnectionError (its request then goes the ordinary way); the next one
    # goes out on a new connection, read by the same loop
    answers: list[Any] = []
    for _ in range(2):
        got.clear()
        inflight.send(call, got.append)
        spin(hub, lambda: len(got) == 1)
        answers.append(got[0])
    assert isinstance(answers[-1], (list, int)), answers
    assert inflight.drop() == 0
    inflight.close()


@pytest.fixture
def funnels() -> Iterator[RedisServer]:
    """The funnels' Redis, apart from the broker and the run records."""
    with RedisServer() as server:
        yield server


def test_every_task_runs_once_while_scripts_are_flushed_and_connections_killed(
    standalone_url: str, funnels: RedisServer
) -> None:
    """300 tasks under a 200/s worker-wide limit on 1 worker (prefork, 2 processes);
    from before the first is sent until the last has run, every 50 ms the funnels'
    scripts are flushed and every connection that last ran a script is killed. (Begun
    only once all were sent, it killed nothing in a loaded run: the sending, slowed by
    the load, left it little or none of the run.)"""
    app = make_app(standalone_url, funnels.url, store_url=standalone_url, task_ignore_result=True)
    env = {"FUNNEL_TEST_LIMITS": '{"proj.plain": "200/s"}', "FUNNEL_TEST_STORE": standalone_url}
    kills: list[int] = []
    done = threading.Event()

    def chaos() -> None:
        with redis.Redis.from_url(funnels.url) as client:
            while not done.wait(0.05):
                client.script_flush()
                for each in client.client_list():
                    # the last command a script's call (a flushed script is loaded again)
                    if each.get("cmd") in {"evalsha", "eval", "script|load"}:
                        kills.append(client.client_kill_filter(_id=each["id"]))

    with workers(standalone_url, funnels.url, 1, **env) as started:
        started.wait_ready()
        flushing = threading.Thread(target=chaos, daemon=True)
        flushing.start()
        try:
            ids = set(send(app, "proj.plain", 300))
            wait_for(lambda: len({r["id"] for r in runs(standalone_url)}) >= 300, 300)
        finally:
            done.set()
            flushing.join(30)
        count = len(runs(standalone_url))
        with pytest.raises(AssertionError):  # nothing runs a second time afterwards
            wait_for(lambda: len(runs(standalone_url)) > count, 3)
        logs = started.logs()
    close_app(app)
    assert sum(kills) > 0
    once_each(standalone_url, "proj.plain", ids)
    assert "carrying a decided request on failed" not in logs


def test_a_deferral_sends_the_next_decisions_the_ordinary_way_for_a_while(
    redis_funnel: RedisFunnel, hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While tasks are deferred, each decision waits for its reply, as before: tasks
    coming back for their slots are decided at their time (all in flight, a 10 000-task
    burst took 142 s instead of 34-54 s)."""
    inflight = InFlight(lambda: redis_funnel, hub)
    assert inflight.on
    inflight.deferred()
    assert not inflight.on
    clock = time.monotonic() + _inflight.CALM_SECONDS
    monkeypatch.setattr(_inflight.time, "monotonic", lambda: clock)
    assert inflight.on
    assert InFlight(lambda: redis_funnel, None).on is False  # no event loop: always wait


def _decisions(app: Any, hub: Hub) -> InFlightDecisions:
    """The worker gate's decisions in flight over a real app's runtime and Redis; the
    gate's own steps are not reached here."""
    runtime = runtime_for(app)

    def unreached(*args: Any) -> Any:
        raise AssertionError(f"not reached in this test: {args!r}")

    inflight = InFlight(lambda: runtime.funnel, hub)
    return InFlightDecisions(runtime, live_for(app), inflight, unreached, unreached, unreached)


def test_a_call_reused_for_the_same_charges_carries_each_tasks_own_ticket(
    redis_url: str, redis_client: redis.Redis, hub: Hub
) -> None:
    app = make_app(redis_url, redis_url)
    try:
        gate = _decisions(app, hub)
        charge = Charge(Limit(Rate.parse("1/s")), "{inflight}:reused", 1, "t")
        loaded = Charge(Limit(Rate.parse("1/s")), "{inflight}:loaded", 1, "t")
        assert judge(gate.runtime, Subject("t", "0", "allow"), [loaded], State()).run
        subjects = [Subject("t", task_id, "allow") for task_id in ("a", "b", "c")]
        calls = [gate.call(s, [charge], State()) for s in subjects]
        assert len(gate.calls) == 1  # captured once, for the three tasks
        steps: dict[str, Ruling] = {}

        def resume(subject: Subject, reply: Any) -> None:
            assert not isinstance(reply, BaseException), reply
            decide = partial(judge, gate.runtime, subject, [charge], State())
            steps[subject.task_id] = decide(funnel=gate.inflight.replay(reply, None))

        for subject, call in zip(subjects, calls, strict=True):
            assert call is not None
            assert subject.task_id in call[2]
            assert STAND_IN not in call[2]
            gate.inflight.send(call, partial(resume, subject))
        spin(hub, lambda: len(steps) == 3)
        assert [steps[t].run for t in "abc"] == [True, False, False]
        assert steps["b"].delay < steps["c"].delay  # one slot each, in order
        booked = redis_client.zrange(tickets_key("{inflight}:reused"), 0, -1)
        assert booked == [b"b", b"c"]  # under each task's own id
        gate.inflight.close()
    finally:
        close_app(app)
