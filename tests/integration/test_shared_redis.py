"""Safe on a shared Redis: funnels beside a broker, results and other apps' keys.

- ``celery funnel reset`` deletes funnel keys only, whatever the prefix (empty, glob
  characters) or the name (one equal to the broker's queue);
- a worker whose Redis ACL user may touch only ``~<prefix>*`` runs every strategy;
- configuration faults (wrong password, NOPERM, a read-only replica) and an evicting
  ``maxmemory-policy`` are told at worker start in one line, and tasks meeting a fault
  fail at once instead of being backed off.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_funnel import RedisFunnel, signals
from celery_funnel._limiter.errors import BackendConfigurationError
from celery_funnel._limiter.keys import limit_key, task_key
from celery_funnel._stores.check import acl_line
from celery_funnel.testing import RedisServer, find_redis_servers
from tests.integration.proj import close_app
from tests.integration.shared_proj import make_shared_app

pytestmark = pytest.mark.redis
ROOT = str(Path(__file__).resolve().parents[2])
BINARIES = [pytest.param(b, id=Path(b).parent.name) for b in find_redis_servers()]


def cli(url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"FUNNEL_SHARED_URL": url, "FUNNEL_SHARED_PREFIX": prefix, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.shared_proj", "funnel", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False,
    )  # fmt: skip


def _funnels(client: redis.Redis, prefix: str) -> dict[str, set[str]]:
    """Funnels of every kind, written through the core: family name -> its keys."""
    funnel = RedisFunnel(client)
    named = task_key(prefix, "celery")  # the task named like the queue
    funnel.reserve(named, 0, 1, 3600, ticket="a")
    funnel.reserve(named, 0, 1, 3600, ticket="b")  # booked: a tickets key
    part = task_key(prefix, "celery", "cust1")
    funnel.throttle(part, 0, 1, 3600)
    worker_wide = limit_key(prefix, "cel*")
    funnel.throttle(worker_wide, 0, 1, 3600)
    window = task_key(prefix, "strat.sliding_window")
    funnel.sliding_window(window, 5, 3600)
    return {
        "celery": {named, named + "#tickets", part},
        "others": {worker_wide, window},
    }


def _populate(url: str, prefix: str, client: redis.Redis) -> dict[str, set[str]]:
    """Broker queue (kombu publishing), results (the result backend writing), other
    apps' keys that unescaped globs of ``prefix`` would match, and the funnels."""
    app = make_shared_app(url, prefix)
    try:
        for n in range(3):  # no worker: the messages wait in the broker's queue
            app.tasks["celery"].apply_async((n,))
            app.backend.store_result(f"result-{n}", n, "SUCCESS")
    finally:
        close_app(app)
    for foreign in [
        "other-app:{celery}", "x{celery}", f"{prefix}other", f"{prefix}{{not a funnel}}",
        f"{prefix}{{celery}}:elsewhere", "*", "?", "[", "app1:{celery}",
    ]:  # fmt: skip
        client.set(foreign, "not ours")
    assert client.llen("celery") == 3
    assert len(client.keys("celery-task-meta-*")) == 3
    return _funnels(client, prefix)


@pytest.mark.parametrize("prefix", ["", "*", "?", "[", "app*[1]?:", "funnel:"])
def test_reset_deletes_funnel_keys_only(standalone_url: str, prefix: str) -> None:
    with redis.Redis.from_url(standalone_url) as client:
        families = _populate(standalone_url, prefix, client)
        before = {k.decode() for k in client.keys("*")}
        funnels = families["celery"] | families["others"]
        assert funnels <= before

        done = cli(standalone_url, prefix, "reset", "celery", "--yes")
        after = {k.decode() for k in client.keys("*")}
        if not prefix:
            assert done.returncode != 0
            assert "funnel_key_prefix is empty" in done.stderr
            assert after == before  # nothing deleted
            return
        assert done.returncode == 0, done.stderr
        assert after == before - families["celery"], done.stdout  # the queue survives
        assert client.llen("celery") == 3

        done = cli(standalone_url, prefix, "reset", "--all", "--yes")
        assert done.returncode == 0, done.stderr
        after = {k.decode() for k in client.keys("*")}
        assert after == before - funnels
        assert client.llen("celery") == 3
        assert len(client.keys("celery-task-meta-*")) == 3


@pytest.fixture(params=BINARIES)
def server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    with RedisServer(request.param) as running:
        yield running


def _worker_app(server: RedisServer, funnel_url: str, prefix: str = "app:") -> Celery:
    return make_shared_app(server.url, prefix, funnel_url)


def test_an_acl_user_limited_to_the_prefix_runs_every_strategy(server: RedisServer) -> None:
    admin = redis.Redis(port=server.port)
    admin.execute_command(*acl_line("app:", "fun").replace(">PASSWORD", ">pw").split())
    app = _worker_app(server, f"redis://fun:pw@127.0.0.1:{server.port}/0")
    names = ["strat.gcra", "strat.fixed_window", "strat.sliding_window", "strat.sliding_log"]
    deferred: list[dict[str, Any]] = []

    def on_deferred(sender: Any = None, **fields: Any) -> None:
        deferred.append(fields)

    signals.task_deferred.connect(on_deferred, weak=False)
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            results = [app.tasks[name].delay(n) for name in names for n in range(3)]
            results += [app.tasks["strat.two"].delay(n % 2) for n in range(4)]
            results += [app.tasks["strat.plain"].delay(n) for n in range(3)]
            assert [r.get(timeout=30) for r in results] == [*[0, 1, 2] * 4, 0, 1, 0, 1, 0, 1, 2]
    finally:
        signals.task_deferred.disconnect(on_deferred)
        close_app(app)
        admin.close()
    # 5/s with capacity 1: tasks waited, and GCRA ones booked their slots (tickets)
    assert any(d.get("booked") for d in deferred), deferred
    assert not [d for d in deferred if d.get("outage")], "no Redis error on the way"


def _start_reports(app: Celery, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The celery_funnel log records of a worker start; then a task meets the fault
    and fails at once (no back-off, no deferral)."""
    caplog.set_level(logging.INFO, logger="celery_funnel")
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        at_start = [r for r in caplog.records if r.name == "celery_funnel"]
        failed = app.tasks["strat.gcra"].delay(1)
        with pytest.raises(BackendConfigurationError) as err:
            failed.get(timeout=30, propagate=True)
        assert "Redis refused" in str(err.value)
        assert failed.state == "FAILURE"
    outages = [r for r in caplog.records if "funnel backend failed" in r.getMessage()]
    assert outages == []  # never handled as an outage (no back-off)
    return at_start


@pytest.mark.parametrize("fault", ["wrong password", "NOPERM", "READONLY replica"])
def test_configuration_faults_are_one_line_at_worker_start_and_fail_tasks(
    server: RedisServer, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis(port=server.port)
    admin.execute_command(*acl_line("app:", "fun").replace(">PASSWORD", ">pw").split())
    urls = {
        "wrong password": f"redis://fun:wrong@127.0.0.1:{server.port}/0",
        "NOPERM": f"redis://fun:pw@127.0.0.1:{server.port}/0",  # keys outside its ~app:*
    }
    fixes = {"wrong password": "credentials", "NOPERM": "ACL", "READONLY replica": "replica"}
    replica = None
    if fault == "READONLY replica":
        replica = RedisServer(server.binary, None, "--replicaof", "127.0.0.1", str(server.port))
        urls[fault] = replica.start().url
    app = _worker_app(server, urls[fault], prefix="other:" if fault == "NOPERM" else "app:")
    try:
        records = _start_reports(app, caplog)
    finally:
        close_app(app)
        if replica is not None:
            replica.stop()
        admin.close()
    errors = [r for r in records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert "\n" not in line
    assert fixes[fault] in line
    assert ":wrong@" not in line


def test_an_evicting_policy_warns_at_worker_start_and_in_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer(None, None, "--maxmemory-policy", "allkeys-lru") as server:
        app = make_shared_app(server.url, "app:")
        caplog.set_level(logging.INFO, logger="celery_funnel")
        try:
            with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
                assert app.tasks["strat.gcra"].delay(4).get(timeout=30) == 4
        finally:
            close_app(app)
        warnings = [
            r.getMessage()
            for r in caplog.records
            if r.name == "celery_funnel" and r.levelno == logging.WARNING
        ]
        assert [w for w in warnings if "maxmemory-policy is allkeys-lru" in w], warnings
        done = cli(server.url, "app:", "check")
        assert done.returncode == 0, done.stderr
        assert "warning: maxmemory-policy is allkeys-lru" in done.stdout


def test_check_reports_an_acl_gap_with_the_line_that_fixes_it(server: RedisServer) -> None:
    admin = redis.Redis(port=server.port)
    admin.execute_command(*acl_line("app:", "fun").replace(">PASSWORD", ">pw").split())
    admin.close()
    url = f"redis://fun:pw@127.0.0.1:{server.port}/0"
    done = cli(url, "app:", "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: celery-funnel can keep its funnels in this Redis" in done.stdout
    assert "fun:****@" in done.stdout  # the URL shown, its password masked
    assert "pw@" not in done.stdout
    done = cli(url, "other:", "check")  # its keys are outside the user's ~app:*
    assert done.returncode == 1
    (error,) = [line for line in done.stdout.splitlines() if ": error: " in line]
    assert "ACL user lacks a permission" in error
    assert "ACL SETUSER funnel on >PASSWORD resetkeys ~other:* resetchannels &other:* -@all" in (
        done.stdout
    )
