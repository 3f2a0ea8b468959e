"""The funnels' Redis SIGKILLed and started again while tasks wait on it, on two real
``celery worker`` processes: every task runs, once. Without an append-only file nothing
is parked there (``funnel_park="auto"``): long waits stay in the broker and the workers;
with one (``appendfsync always``) tasks are parked and the restart keeps them. Each way
a task waits: a rate (FunnelTask and the worker gate), a concurrency slot, a fair-share
turn (which refuses to start where nothing may be parked). The runs are recorded in a
Redis of their own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.proj import close_app
from tests.integration.restart_proj import make_restart_app, restart_runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = str(Path(__file__).resolve().parents[2])
AOF_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def store() -> Iterator[RedisServer]:
    """A Redis of the test's own for run records (the broker is ``conftest``'s)."""
    with RedisServer() as server:
        yield server


def workers(broker: str, funnels: str, store: str, **env: str) -> CeleryWorkers:
    base = {"FUNNEL_TEST_BROKER": broker, "FUNNEL_TEST_REDIS": funnels, "FUNNEL_TEST_STORE": store}
    return CeleryWorkers(
        "tests.integration.restart_proj", 2, {**base, **env}, "-c", "2", "-Q", "restart", cwd=ROOT
    )


def send(app: Celery, name: str, count: int, tenants: int = 0) -> set[str]:
    ids = set()
    with app.producer_or_acquire() as producer:
        for n in range(count):
            kwargs = {"tenant": f"t{n % tenants}"} if tenants else {}
            ids.add(app.tasks[name].apply_async((n,), kwargs, producer=producer).id)
    return ids


def once_each(store: str, ids: set[str]) -> list[dict[str, Any]]:
    """The runs of ``ids``, checked: each ran, once."""
    recorded = [r for r in restart_runs(store) if r["id"] in ids]
    counts = Counter(r["id"] for r in recorded)
    assert len(counts) == len(ids), f"lost: {len(ids) - len(counts)} of {len(ids)}"
    assert max(counts.values()) == 1, f"run twice: {sum(n - 1 for n in counts.values())}"
    return recorded


def parked(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return ParkStore(client, "funnel:").count()


def run_with_restart(
    funnels: RedisServer, broker: RedisServer, store: RedisServer, name: str, count: int,
    *, kill_after: int, tenants: int = 0, park_first: int = 0, logged: str = "",
    env: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], str]:  # fmt: skip
    """Send ``count`` tasks ``name``; once ``kill_after`` ran (and ``park_first`` are
    parked), SIGKILL the funnels' Redis and start it again; the runs once every task
    ran (and the workers logged ``logged``), and the workers' logs. The fair task is
    registered only when it is the one sent (where nothing may be parked, a worker
    refuses to start with it)."""
    fair = name == "restart.fair"
    app = make_restart_app(broker.url, funnels.url, store.url, fair=fair)
    env = {"FUNNEL_TEST_FAIR": "1" if fair else "0", **(env or {})}
    try:
        with workers(broker.url, funnels.url, store.url, **env) as started:
            ids = send(app, name, count, tenants)
            wait_for(lambda: len(restart_runs(store.url)) >= kill_after, 60)
            if park_first:
                wait_for(lambda: parked(funnels.url) >= park_first, 30)
            funnels.kill()
            funnels.start()
            wait_for(lambda: len(restart_runs(store.url)) >= count, 120)
            wait_for(lambda: logged in started.logs(), 30)
            logs = started.logs()
    finally:
        close_app(app)
    return once_each(store.url, ids), logs


@pytest.mark.parametrize(
    ("name", "env"),
    [("restart.rate", {}), ("restart.plain", {"FUNNEL_TEST_LIMITS": '{"restart.plain": "20/s"}'})],
    ids=["FunnelTask", "worker gate"],
)
def test_a_restart_without_aof_loses_no_task_of_a_backlog(
    broker: RedisServer, store: RedisServer, name: str, env: dict[str, str]
) -> None:
    """200 tasks at 20/s on two workers, the funnels' Redis (no persistence) SIGKILLed
    and started again mid-run: 200 of 200 run, none twice (109 and 107 ran when
    tasks were parked there)."""
    with RedisServer() as funnels:
        _, logs = run_with_restart(
            funnels,
            broker,
            store,
            name,
            200,
            kill_after=60,
            env={"FUNNEL_TEST_RATE": "20/s", **env},
        )
    assert "parking is off: the funnels' Redis has no append-only file" in logs


@pytest.mark.parametrize("aof", [False, True], ids=["no persistence", "AOF always"])
def test_tasks_waiting_long_survive_a_restart(
    broker: RedisServer, store: RedisServer, aof: bool
) -> None:
    """30 tasks waiting behind 2/s (up to 15 s), the funnels' Redis SIGKILLed and
    started again about 8 s in: all 30 run once (11 were lost when parked in a Redis
    without persistence). With AOF they are parked, and the restart keeps them;
    without, nothing is parked, and the restart is noticed and logged."""
    with RedisServer(None, None, *(AOF_ALWAYS if aof else ())) as funnels:
        recorded, _ = run_with_restart(
            funnels, broker, store, "restart.rate", 30, kill_after=14,
            park_first=8 if aof else 0, env={"FUNNEL_TEST_RATE": "2/s"},
            logged="the funnels' Redis restarted (run_id",
        )  # fmt: skip
        requeued = [r for r in recorded if r.get("requeues")]
        if aof:
            assert len(requeued) >= 8, "long waits were parked"
        else:
            assert not requeued, "nothing was parked, nor published again"
            assert parked(funnels.url) == 0


@pytest.mark.parametrize("aof", [False, True], ids=["no persistence", "AOF always"])
def test_slot_waiters_survive_a_restart(broker: RedisServer, store: RedisServer, aof: bool) -> None:
    """30 tasks of 0.3 s, 2 at once, on two workers of 2 processes: most wait for a
    slot (parked with AOF, held in the workers without). The funnels' Redis SIGKILLed and
    started again with 8 run: all 30 run once."""
    with RedisServer(None, None, *(AOF_ALWAYS if aof else ())) as funnels:
        run_with_restart(
            funnels, broker, store, "restart.slot", 30, kill_after=8,
            park_first=4 if aof else 0,
        )  # fmt: skip


def test_fair_share_without_parking_refuses_to_start(
    broker: RedisServer, store: RedisServer
) -> None:
    """A funnels' Redis without AOF that is not the broker's: no task may be parked
    there, so a worker with a fair-share task stops at start, in one line naming the
    task and why (before: silently an ordinary funnel)."""
    env = {"FUNNEL_TEST_FAIR": "1"}
    with RedisServer() as funnels:
        started = workers(broker.url, funnels.url, store.url, **env).start()
        try:
            wait_for(lambda: all(p.poll() is not None for p in started.processes), 60)
            logs = started.logs()
        finally:
            started.stop()
    assert (
        "ConfigurationError: task 'restart.fair': funnel_fair_by queues each tenant's waiting"
        " tasks parked in the funnels' Redis, and none may be parked there: the funnels'"
        " Redis has no append-only file and is not the broker's Redis server" in logs
    ), logs


def test_fair_share_waiters_survive_a_restart(broker: RedisServer, store: RedisServer) -> None:
    """30 tasks of 3 tenants sharing 2/s (parked in their tenants' queues), the funnels'
    Redis (AOF always) SIGKILLed and started again with 10 run: all 30 run once."""
    with RedisServer(None, None, *AOF_ALWAYS) as funnels:
        run_with_restart(
            funnels, broker, store, "restart.fair", 30, kill_after=10, tenants=3,
            park_first=8, env={"FUNNEL_TEST_RATE": "2/s"},
        )  # fmt: skip
