"""Concurrency limits with leases, on real ``celery worker`` processes (prefork): at most
N running at once across the workers, per key, with a rate on the same task; every way
a run ends gives its slot back at once; a worker SIGKILLed while it holds slots loses
them after the lease's TTL; waiters are released by the run that frees a slot.

"Running" is measured from the tasks' own records (``lease_proj``): each run notes its
start and its end from inside its body. Figures are printed (``pytest -s``) for the
README; only behaviour is asserted (counts and peaks), throughput only loosely.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_funnel._limiter.keys import task_key
from celery_funnel._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from celery_funnel._stores.concurrency import ConcurrencyFunnel, ConcurrencyStore, Holder
from celery_funnel.dashboard._state import funnel_state
from celery_funnel.testing import CeleryWorkers, RedisServer, peak
from tests.integration.lease_proj import ENDS, STARTS, make_app
from tests.integration.proj import close_app
from tests.polling import wait_for
from tests.redis_monitor import funnel_log, one_slot_each, started_early

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])
PREFIX = "funnel:"


def workers(url: str, count: int, processes: int, prefix: str, **env: str) -> CeleryWorkers:
    """Workers of ``lease_proj`` consuming the queue ``prefix`` (each group its own)."""
    base = {"FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url, "FUNNEL_TEST_QUEUE": prefix}
    return CeleryWorkers(
        "tests.integration.lease_proj", count, {**base, **env}, "-c", str(processes),
        "-Q", prefix, cwd=ROOT, prefix=prefix,
    )  # fmt: skip


class Cluster:
    """A Redis (broker, funnels, results, records), an app to send with, workers."""

    def __init__(self, url: str, app: Celery, group: CeleryWorkers) -> None:
        self.url, self.app, self.workers = url, app, group
        self.client = redis.Redis.from_url(url)
        self.store = ConcurrencyStore(self.client, PREFIX, 30.0)

    def records(self, which: str) -> list[dict[str, Any]]:
        return [json.loads(item) for item in self.client.lrange(which, 0, -1)]

    def holders(self, task: str, part: str = "") -> list[Holder]:
        return self.store.holders(task_key(PREFIX, task, part))

    def clear(self) -> None:
        self.client.delete(STARTS, ENDS)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(aof=True) as started:  # waiters are parked only where AOF is on
        yield started


def _cluster(server: RedisServer, group: CeleryWorkers) -> Iterator[Cluster]:
    app = make_app(server.url, server.url, group.prefix)
    with group:
        cluster = Cluster(server.url, app, group)
        yield cluster
        cluster.client.close()
    close_app(app)


# The leases of the ``cluster`` workers: long, so that the renewer's sweep (every TTL / 3,
# it gives back the slots of runs the worker forgot) comes too seldom to pass for a run
# giving its slot back at its end. With the default 30 s, a slot an ending failed to
# give back came free at the next sweep, up to 10 s later: within 2 s one time in five.
LONG_TTL = 300.0
AT_ONCE = 2.0  # seconds: a slot given back at the run's end is free within this


@pytest.fixture(scope="module")
def cluster(server: RedisServer) -> Iterator[Cluster]:
    """Two workers with four pool processes each; leases of ``LONG_TTL``; the plain
    task limited to 2 at once per worker by a funnel_limits entry."""
    limits = json.dumps({"leases.plain": {"concurrency": 2, "scope": "worker"}})
    group = workers(
        server.url, 2, 4, "w", FUNNEL_TEST_LIMITS=limits, FUNNEL_TEST_LEASE_TTL=str(LONG_TTL)
    )
    yield from _cluster(server, group)


def running_peak(
    cluster: Cluster, died_at: float | None = None, key: str | None = None, worker: str = ""
) -> int:
    """The most runs at once, from the runs' own start and end records; a run with no
    end (its worker was killed) ends at ``died_at``; of ``key`` only, or ``worker``."""
    starts = [
        r
        for r in cluster.records(STARTS)
        if (key is None or r.get("key") == key) and r["worker"].startswith(worker)
    ]
    ended = {(r["id"], r["worker"]): r["at"] for r in cluster.records(ENDS)}
    events = []
    for run in starts:
        end = ended.get((run["id"], run["worker"]), died_at)
        assert end is not None, f"run {run} never ended"
        events += [(run["at"], 1), (end, -1)]
    now = best = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        best = max(best, now)
    return best


def ended_ids(cluster: Cluster) -> set[str]:
    return {r["id"] for r in cluster.records(ENDS)}


def test_three_at_once_over_two_workers_of_four_processes(cluster: Cluster) -> None:
    """funnel_concurrency=3, 60 tasks of 0.2 s over 8 pool processes."""
    cluster.clear()
    sent = [cluster.app.send_task("leases.three", (0.2,)).id for _ in range(60)]
    wait_for(lambda: ended_ids(cluster) >= set(sent), 60)
    starts = sorted(r["at"] for r in cluster.records(STARTS))
    last_end = max(r["at"] for r in cluster.records(ENDS))
    throughput = len(sent) / (last_end - starts[0])
    most = running_peak(cluster)
    print(f"\nconcurrency 3, 2x4 processes, 60 x 0.2 s: peak {most}, {throughput:.2f} tasks/s")
    assert len(starts) == 60  # each ran once
    assert most == 3
    # every seat given back after its body (the leases last LONG_TTL: a seat kept would
    # still be held). Was also: > 7.5 tasks/s, how fast a loaded machine runs them (the
    # speed is bench's; a seat given back late is test_each_ending_gives_the_slot_back's)
    wait_for(lambda: cluster.holders("leases.three") == [], 10)


def test_per_key(cluster: Cluster) -> None:
    """funnel_concurrency=2 with funnel_key: 2 at once per key, over 5 keys."""
    cluster.clear()
    keys = [f"c{i}" for i in range(5)]
    sent = [
        cluster.app.send_task("leases.per_key", (keys[n % 5], 0.2)).id for n in range(40)
    ]  # fmt: skip
    wait_for(lambda: ended_ids(cluster) >= set(sent), 60)
    peaks = {key: running_peak(cluster, key=key) for key in keys}
    print(
        f"\nconcurrency 2 per key, 5 keys, 40 x 0.2 s: peaks {peaks}, all {running_peak(cluster)}"
    )
    assert all(most <= 2 for most in peaks.values())
    assert max(peaks.values()) == 2
    wait_for(lambda: all(cluster.holders("leases.per_key", key) == [] for key in keys), 10)


def test_a_full_key_leaves_the_other_keys_free(cluster: Cluster) -> None:
    """funnel_concurrency=2 with funnel_key: while two runs of one key hold its seats
    (until the test lets them end), the tasks of four other keys all run. Was: more
    than 2 running at once over the keys (how the pool happened to overlap them on a
    loaded machine, not whether the keys share their seats)."""
    cluster.clear()
    go = f"go-{uuid.uuid4().hex}"
    holding = [cluster.app.send_task("leases.per_key", ("c0", 0.0, go)).id for _ in range(2)]
    try:
        wait_for(lambda: {r["id"] for r in cluster.records(STARTS)} >= set(holding), 60)
        sent = [
            cluster.app.send_task("leases.per_key", (f"c{1 + n % 4}", 0.0)).id for n in range(8)
        ]  # fmt: skip
        wait_for(
            lambda: ended_ids(cluster) >= set(sent), 60,
            lambda: f"not run while c0 was full: {set(sent) - ended_ids(cluster)}",
        )  # fmt: skip
        assert not ended_ids(cluster) & set(holding), "c0's runs held their seats throughout"
    finally:
        cluster.client.set(go, 1, ex=600)
    wait_for(lambda: ended_ids(cluster) >= set(holding), 60)
    wait_for(lambda: cluster.holders("leases.per_key", "c0") == [], 10)


def test_a_worker_wide_limit_per_worker(cluster: Cluster) -> None:
    """{"concurrency": 2, "scope": "worker"} in funnel_limits on a plain task: 2 at once
    on each worker, 16 tasks of 0.2 s."""
    cluster.clear()
    sent = [cluster.app.send_task("leases.plain", (0.2,)).id for _ in range(16)]
    wait_for(lambda: ended_ids(cluster) >= set(sent), 60)
    peaks = {w: running_peak(cluster, worker=w) for w in ("w1@", "w2@")}
    print(f"\nconcurrency 2 per worker, 16 x 0.2 s: peaks {peaks}, all {running_peak(cluster)}")
    assert max(peaks.values()) == 2
    assert running_peak(cluster) <= 4


def test_rate_and_concurrency_both_hold(cluster: Cluster) -> None:
    """funnel_concurrency=2 and funnel_rate="5/s" on one task: 15 tasks of 0.3 s (the
    seats alone would start 6.7/s): never more than 2 running; the rate read from the
    funnel's decisions on Redis's clock: one 0.2 s slot a run, no run before its slot.
    Was: at most 6 starts in any second and a span of starts of at least 2.5 s (the
    pool's dispatch on a loaded machine bunches and stretches starts)."""
    cluster.clear()
    key = task_key(PREFIX, "leases.both")
    with funnel_log(cluster.url, key) as log:
        sent = [cluster.app.send_task("leases.both", (0.3,)).id for _ in range(15)]
        wait_for(lambda: ended_ids(cluster) >= set(sent), 60)
    starts = [r["at"] for r in cluster.records(STARTS)]
    most = running_peak(cluster)
    writes = log.decisions(key)
    slots = one_slot_each(writes, 0.2, before=log.first_tat(key))
    print(f"\nconcurrency 2 + 5/s, 15 x 0.3 s: peak {most}, {len(writes)} decisions,"
          f" {peak(slots)} slots in 1 s")  # fmt: skip
    assert len(starts) == 15
    assert most <= 2
    assert len(writes) >= 15, "a decision for each run"
    assert peak(slots) <= 6, "5/s, capacity 1"
    assert started_early(starts, slots, DEFAULT_EARLY_SECONDS) == [], "a run before its slot"


ENDINGS = ["success", "fail", "retry", "reject", "ignore", "soft", "hard", "terminate"]


@pytest.fixture
def ends(cluster: Cluster) -> Iterator[Cluster]:
    """``cluster``; afterwards, a slot of ``leases.ends`` still held (an ending that
    failed to give it back) is freed, so that the next ending does not wait for the
    sweep of ``LONG_TTL`` / 3 to start."""
    yield cluster
    key = task_key(PREFIX, "leases.ends")
    for holder in cluster.holders("leases.ends"):
        cluster.store.free([ConcurrencyFunnel(1, key, "leases.ends")], holder.task_id, "*")


@pytest.mark.parametrize("how", ENDINGS)
def test_each_ending_gives_the_slot_back(ends: Cluster, how: str) -> None:
    """funnel_concurrency=1, leases of ``LONG_TTL``: however the run ends, its slot is
    free at once (within ``AT_ONCE``, far below the renewer's sweep interval, so
    neither a lease running out nor the sweep freed it), and the next task runs."""
    cluster = ends
    cluster.clear()
    options: dict[str, Any] = {"soft": {"soft_time_limit": 0.3}, "hard": {"time_limit": 0.5}}
    sent = cluster.app.send_task(
        "leases.ends", ("sleep" if how == "terminate" else how,), **options.get(how, {})
    )
    wait_for(lambda: any(r["id"] == sent.id for r in cluster.records(STARTS)), 20)
    if how == "terminate":
        wait_for(lambda: cluster.holders("leases.ends") != [], 5)
        cluster.app.control.revoke(sent.id, terminate=True)
    if how == "retry":  # the retry takes the slot again, then succeeds
        wait_for(lambda: sent.id in ended_ids(cluster), 20)
    if how != "ignore":  # Ignore stores no state
        wait_for(lambda: sent.state not in ("PENDING", "STARTED"), 20)
    ended = time.monotonic()
    wait_for(lambda: cluster.holders("leases.ends") == [], AT_ONCE)
    freed = time.monotonic() - ended
    following = cluster.app.send_task("leases.ends", ("success",))
    assert following.get(timeout=20) == "success"
    print(f"\nending {how}: {sent.state}, slot free {freed * 1000:.0f} ms after")
    assert freed < 10  # the lease lasts LONG_TTL: it was given back, not run out
    assert freed < AT_ONCE  # the sweep (every LONG_TTL / 3) did not free it either


def celery_funnel(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.lease_proj", "funnel", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False,
    )  # fmt: skip


def test_status_and_release_lease(cluster: Cluster) -> None:
    """``celery funnel status`` shows N, in use, the holders and the parked waiters;
    ``release-lease`` (confirmed) frees a slot, and the waiter runs at once."""
    cluster.clear()
    # a holder of 10 s could end before the last of four CLI calls (each a new
    # process: seconds apiece on a loaded machine), taking its slot with it
    holder = cluster.app.send_task("leases.ends", ("long",))
    wait_for(lambda: any(h.token for h in cluster.holders("leases.ends")), 20)
    waiter = cluster.app.send_task("leases.ends", ("success",))
    waiting = cluster.store.waiting
    wait_for(lambda: waiting(task_key(PREFIX, "leases.ends")) == 1, 20)

    done = celery_funnel(cluster.url, "status", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json.loads(done.stdout) if r["name"] == "leases.ends"]
    assert (row["kind"], row["capacity"], row["in_use"], row["parked"]) == ("concurrency", 1, 1, 1)
    (slot,) = row["holders"]
    assert slot["task_id"] == holder.id
    assert slot["worker"].startswith("w")
    assert 0 <= slot["age"] < 10
    assert "(in " in slot["lease_expiry"]

    shown = funnel_state(cluster.app)["funnels"]
    assert [f["running"] for f in shown if f["name"] == "leases.ends"] == [1], "the dashboard"

    table = celery_funnel(cluster.url, "status").stdout
    print(f"\n{table}")
    assert f"seat: task {holder.id} on w" in table

    refused = celery_funnel(cluster.url, "release-lease", "leases.ends", holder.id)
    assert refused.returncode != 0  # no --yes, no terminal: no
    assert waiter.state == "PENDING"
    freed = celery_funnel(cluster.url, "release-lease", "leases.ends", holder.id, "--yes")
    assert freed.returncode == 0, freed.stderr
    assert "freed 1 seat; 1 parked task released" in freed.stdout
    assert waiter.get(timeout=20) == "success"  # while the holder still sleeps
    cluster.app.control.revoke(holder.id, terminate=True)
    wait_for(lambda: cluster.holders("leases.ends") == [], 10)


TTL = 3.0  # the lease of the SIGKILL test: renewed every TTL / 3


@pytest.fixture
def short_leases(server: RedisServer) -> Iterator[Cluster]:
    """Two workers of two pool processes, leases of 3 s, acks_late with a 5 s
    visibility timeout (the runs a SIGKILL ends come back); new for each test (a test
    kills or stops one: the next must not depend on which ran first)."""
    group = workers(
        server.url, 2, 2, "k", FUNNEL_TEST_LEASE_TTL=str(TTL), FUNNEL_TEST_VISIBILITY="5"
    )
    yield from _cluster(server, group)


def test_sigkill_of_a_worker_holding_slots(short_leases: Cluster) -> None:
    """funnel_concurrency=3, 12 tasks of 1 s; the first worker is SIGKILLed (with its
    pool) while it holds slots, once every task is off the broker: their leases end at
    most the TTL after the kill (on Redis's clock), the other worker frees them, every
    task completes, and never more than 3 run at once."""
    cluster = short_leases
    cluster.clear()
    sent = [cluster.app.send_task("leases.three", (1.0,)).id for _ in range(12)]

    def dying() -> list[Holder]:
        return [h for h in cluster.holders("leases.three") if h.worker.startswith("k1@")]

    wait_for(lambda: any(h.token for h in dying()), 20)
    # killed once every task has been received: kombu's Redis transport pops a message
    # before it records it as unacked, and a SIGKILL in between loses the message in
    # the broker, before any of our code sees it (celery/celery#7950)
    wait_for(lambda: all(f"[{task_id}] received" in cluster.workers.logs() for task_id in sent), 20)
    os.killpg(cluster.workers.processes[0].pid, signal.SIGKILL)  # the worker and its pool
    killed = time.time()  # this machine's clock: Redis's too
    held = dying()  # nothing renews them now: their leases end where they stand
    wait_for(lambda: not dying(), 60)  # a hang, not a speed: swept by the other worker
    returned = time.time() - killed
    wait_for(lambda: ended_ids(cluster) >= set(sent), 120)
    most = running_peak(cluster, died_at=killed)
    ends = [h.expires - killed for h in held]
    print(
        f"\nSIGKILL with leases of {TTL} s: leases ended {max(ends, default=0.0):.2f} s after"
        f" the kill, slots back after {returned:.2f} s, peak {most}"
    )
    assert held, "the killed worker held slots"
    # a lease lasts TTL from its last renewal, on Redis's clock: freed by then at most
    assert max(ends) <= TTL, ends
    assert most <= 3


def test_warm_shutdown_gives_the_slots_back(short_leases: Cluster) -> None:
    """The worker that runs a task is stopped (SIGTERM, warm) meanwhile: the run ends
    and its slot is given back; nothing is held after."""
    cluster = short_leases
    cluster.clear()
    sent = cluster.app.send_task("leases.three", (1.0,))
    wait_for(
        lambda: any(h.task_id == sent.id and h.token for h in cluster.holders("leases.three")), 20
    )
    # the seat is taken before the run reaches a pool process: wait until it runs
    wait_for(lambda: sent.id in {r["id"] for r in cluster.records(STARTS)}, 20)
    runner = next(r["worker"] for r in cluster.records(STARTS) if r["id"] == sent.id)
    stopped = cluster.workers.processes[0 if runner.startswith("k1@") else 1]
    stopped.terminate()
    try:
        stopped.wait(30)
    except subprocess.TimeoutExpired:
        logs = cluster.workers.logs()[-4000:]
        raise AssertionError(f"no warm shutdown in 30 s:\n{logs}") from None
    assert sent.id in ended_ids(cluster), cluster.workers.logs()[-4000:]
    assert cluster.holders("leases.three") == []
