"""One round trip per decision (issue 18): every command that clients send to the
funnels' Redis while a real worker decides tasks, read with MONITOR, set against the
decisions the gate reported (its signals: one per decision)."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker

from celery_funnel import FunnelTask
from celery_funnel._limiter.backends._chain import chain_script
from celery_funnel._limiter.strategies import (
    allowance,
    fixed_window,
    gcra,
    reservation,
    sliding_log,
    sliding_window,
)
from celery_funnel.testing import RedisServer
from tests.integration.conftest import Recorder
from tests.integration.proj import close_app, make_app

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)

SINGLE = [m.SCRIPT for m in (gcra, reservation, fixed_window, sliding_window, sliding_log)]
# a decision over funnels of two strategies is one script too: the chain of both
CHAINS = [chain_script(pair) for pair in itertools.permutations(SINGLE, 2)]
DECISION_SCRIPTS = {s.sha: s.name for s in (*SINGLE, *CHAINS)}
DECISIONS = ("task_admitted", "task_deferred", "task_refused")


class Monitor:
    """The commands clients send to a Redis, in a thread, until stopped (script calls
    made inside EVALSHA are left out: they are not round trips)."""

    STOP = "monitor: stop"

    def __init__(self, url: str) -> None:
        # no read timeout (redis-py 8 reads with 5 s by default): a timed-out read drops
        # a MONITOR connection (redis-py), and a limited task leaves gaps; __exit__ ends
        # the reading with a command of its own, read after every command sent before
        # it (a reader that lags behind under load still records them all)
        self.client = redis.Redis.from_url(url, socket_timeout=None)
        self.stopper = redis.Redis.from_url(url)
        self.stopper.ping()  # connected now: its handshake is not recorded
        self.commands: list[list[str]] = []
        self.clients: list[str] = []  # the connection (address:port) of each command
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.client.monitor() as monitor:
            self._ready.set()
            while True:
                got: dict[str, Any] = monitor.next_command()
                if got.get("client_type") == "lua":
                    continue
                if str(got["command"]) == f"ECHO {self.STOP}":
                    return
                self.commands.append(str(got["command"]).split())
                self.clients.append(f"{got.get('client_address')}:{got.get('client_port')}")

    def __enter__(self) -> Monitor:
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopper.echo(self.STOP)
        self._thread.join(30)
        assert not self._thread.is_alive(), "MONITOR never read its stop"
        self.stopper.close()
        self.client.close()


def _background(command: list[str]) -> bool:
    """A worker's periodic work, not a task's: the releaser and the live thread, whose
    keys carry the ``{~parked}`` and ``{~live}`` tags (once per pass, whatever the load)."""
    first_key = command[3] if command[0].upper() == "EVALSHA" and len(command) > 3 else ""
    if command[0].upper() != "EVALSHA" and len(command) > 1:
        first_key = command[1]
    return "{~parked}" in first_key or "{~live}" in first_key


@pytest.fixture
def funnels() -> Iterator[str]:
    """A Redis that holds the funnels and nothing else (broker and results elsewhere)."""
    with RedisServer() as server:
        yield server.url


@pytest.mark.parametrize(
    ("task", "options", "limits"),
    [
        ("rt.never", {"funnel_rate": "1000000/s", "funnel_capacity": 1000}, {}),
        ("rt.limited", {"funnel_rate": "20/s"}, {}),
        ("rt.both", {"funnel_rate": "20/s"}, {"rt.both": "30/s"}),
        ("rt.plain", {}, {"rt.plain": "20/s"}),
        ("rt.window", {"funnel_rate": "20/s", "funnel_strategy": "fixed_window"}, {}),
        (
            "rt.mixed",
            {"funnel_rate": "20/s", "funnel_strategy": "fixed_window"},
            {"rt.mixed": "30/s"},
        ),
        (
            "rt.mixed-limited",
            {"funnel_rate": "4/s", "funnel_strategy": "sliding_log"},
            {"rt.mixed-limited": "6/s"},
        ),
    ],
)
def test_every_decision_is_one_round_trip(
    redis_url: str, funnels: str, recorder: Recorder, task: str, options: dict[str, Any],
    limits: dict[str, str],
) -> None:  # fmt: skip
    """Units taken in batches off (``funnel_allowance``): every decision alone."""
    conf = {"funnel_allowance": False}
    kinds, scripts, decisions = _decide(redis_url, funnels, recorder, task, options, limits, conf)
    assert set(kinds) <= {"EVALSHA"}, kinds
    decided = sum(n for name, n in scripts.items() if name in DECISION_SCRIPTS.values())
    assert decisions >= 12
    assert decided == decisions, (scripts, decisions)


def test_units_taken_in_batches_make_fewer_round_trips_than_decisions(
    redis_url: str, funnels: str, recorder: Recorder
) -> None:
    """The default (``funnel_allowance`` on), a never-limited fast funnel decided
    densely: its calls are decisions, alone or taking units (once loaded), and fewer
    than the runs they decide."""
    options = {"funnel_rate": "1000000/s", "funnel_capacity": 1000}
    kinds, scripts, decisions = _decide(redis_url, funnels, recorder, "rt.batch", options, {}, {})
    assert set(kinds) <= {"EVALSHA", "SCRIPT", "HELLO"}, kinds
    assert kinds["SCRIPT"] <= 1, kinds  # allowance.lua loaded once (a new connection)
    assert kinds["HELLO"] <= 1, kinds
    assert set(scripts) <= {"reserve", "allowance"}, scripts
    assert scripts["allowance"] >= 1
    assert decisions >= 12
    assert sum(scripts.values()) < decisions, (scripts, decisions)


def _decide(
    redis_url: str, funnels: str, recorder: Recorder, task: str, options: dict[str, Any],
    limits: dict[str, str], conf: dict[str, Any],
) -> tuple[Counter[str], Counter[str], int]:  # fmt: skip
    """12 runs of ``task`` on a real worker (threads, -c 2): the kinds of command sent
    to the funnels' Redis on the decisions' path, the scripts they called, and the
    decisions the gate reported."""
    redis.Redis.from_url(redis_url).flushall()
    app = make_app(redis_url, funnels, store_url=redis_url, funnel_limits=limits, **conf)
    base = {"base": FunnelTask, **options} if options else {}

    @app.task(shared=False, name=task, **base)
    def run(n: int) -> int:
        return n

    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        assert run.delay(-1).get(timeout=20) == -1  # scripts loaded, connections made
        before = sum(len(recorder.of(name)) for name in DECISIONS)
        with Monitor(funnels) as monitor:
            results = [run.delay(n) for n in range(12)]
            assert [r.get(timeout=60) for r in results] == list(range(12))
        decisions = sum(len(recorder.of(name)) for name in DECISIONS) - before
    close_app(app)
    # a connection that does the background work is not on the path, the handshake
    # (HELLO) of a new one included
    seen = list(zip(monitor.commands, monitor.clients, strict=True))
    background = {at for c, at in seen if _background(c)}
    on_path = [c for c, at in seen if at not in background]
    evalshas = [c[1] for c in on_path if c[0].upper() == "EVALSHA"]
    names = {**DECISION_SCRIPTS, allowance.SCRIPT.sha: "allowance"}
    return (
        Counter(c[0].upper() for c in on_path),
        Counter(names.get(sha, sha) for sha in evalshas),
        decisions,
    )
