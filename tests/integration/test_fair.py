"""Fair share under one funnel, with real ``celery worker`` processes on a real Redis:
a tenant with few tasks is not starved by one with many, weights share the rate,
higher priority goes first, and many tenants still release at the limit.

Read from the funnel's own decisions on Redis's clock (``tests.fair_log``): the order
in which tasks joined their tenants' queues and were handed slots, and the slots
themselves; a task's start (``fair_proj`` records it) only has to come no earlier than
its slot. Start times and rates over windows on the workers' clock measured how fast
a loaded machine runs the workers (a release at 32/s against 50 was seen); the
dispatcher's pace is measured in bench/fair.py. One cluster of two workers serves the
module.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_funnel._limiter.keys import fair_keys
from celery_funnel._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import CeleryWorkers
from tests.conftest import SERVERS, ServerPool
from tests.fair_log import FairLog, Slot, Wait, fair_log, passed_over
from tests.integration.fair_proj import fair_runs, make_fair_app
from tests.integration.proj import close_app
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])
PREFIX = "funnel:"
# the broker's lists of the queue "fair": kombu's Redis transport keeps one per priority
# step (0, 3, 6, 9), the first under the queue's own name
QUEUES = ("fair", *(f"fair\x06\x16{step}" for step in (3, 6, 9)))


class Cluster:
    """Two workers serving ``fair_proj``, and an app to send with."""

    def __init__(self, url: str, app: Celery) -> None:
        self.url, self.app = url, app
        self.client = redis.Redis.from_url(url)
        self.parked = ParkStore(self.client, PREFIX)

    def runs(self, task: str) -> list[dict[str, Any]]:
        return fair_runs(self.url, task)

    def ingested(self, task: str, count: int) -> bool:
        """Whether the workers took the ``count`` tasks of ``task`` sent off the broker
        (run or parked; up to 2 s of the rate may be on their way to run), so that the
        tasks released from now on do not wait behind them in the broker."""
        taken = self.parked.counts().get(task, 0) + len(self.runs(task)) >= count - 40
        return taken and sum(map(self.client.llen, QUEUES)) == 0

    def drain(self, task: str) -> None:
        """Drop what is left of ``task``'s tasks: parked, queued and in the broker."""
        self.app.control.purge()
        self.parked.purge(task)
        self.client.delete(*fair_keys(f"{PREFIX}{{{task}}}"))


@pytest.fixture(scope="module")
def cluster(server_pool: ServerPool) -> Iterator[Cluster]:
    url = server_pool.url(next(iter(SERVERS)))
    redis.Redis.from_url(url).flushall()
    env = {"FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url}
    app = make_fair_app(url, url)
    options = ("-c", "4", "-Q", "fair")
    with CeleryWorkers("tests.integration.fair_proj", 2, env, *options, cwd=ROOT) as w:
        w.wait_ready()
        yield Cluster(url, app)
    close_app(app)


def key_of(task: str) -> str:
    return f"{PREFIX}{{{task}}}"


def ran(cluster: Cluster, task: str, tenant: str) -> int:
    """How many of ``tenant``'s tasks of ``task`` ran so far."""
    return sum(r["tenant"] == tenant for r in cluster.runs(task))


def handed(log: FairLog, inc: float) -> list[Slot]:
    """The slots ``log`` saw, checked as the funnel hands them (``inc``: seconds a
    slot, at its rate): sorted by time, never closer than one slot, and each one slot
    after the one before unless the funnel ran dry (no pass came before the TAT passed:
    the slot is the time it was handed, as a loaded machine makes it). Returns them."""
    slots = sorted(log.slots, key=lambda s: s.slot)
    assert slots, "no slot was handed out"
    odd = [
        (a, b) for a, b in itertools.pairwise(slots)
        if b.slot - a.slot < inc - 2e-6 or (abs(b.slot - a.slot - inc) > 2e-6 and b.slot > b.at)
    ]  # fmt: skip
    assert odd == [], f"slots not one {inc} s apart, nor handed dry: {len(odd)}, {odd[:3]}"
    # the funnel runs dry at its first slot, and after only when no pass came within the
    # horizon (passes every 50 ms book 250 ms ahead): 1-2 of 25-675 slots measured, under
    # --load too; a dispatcher pausing a second between passes runs it dry at every pass
    dry = [s for s in slots if s.slot <= s.at]
    assert len(dry) <= 2 + len(slots) // 10, f"ran dry {len(dry)} times in {len(slots)} slots"
    return slots


def ran_in_their_slots(cluster: Cluster, log: FairLog, task: str, until: float) -> None:
    """``started_in_their_slots`` for ``task``'s runs, its slots 50 ms apart (20/s); then
    nothing of ``task`` is left for the next test."""
    started_in_their_slots(cluster.runs(task), handed(log, 0.05), until)
    cluster.drain(task)


def started_in_their_slots(runs: list[dict[str, Any]], slots: list[Slot], until: float) -> None:
    """Each task ran once, and every run that started before ``until`` (the end of the
    log) from a slot the log saw handed, none before that slot less the early grace
    (5 ms: two clocks of one machine)."""
    slot = {s.task: s.slot for s in slots}  # the last slot handed to each task
    ids = Counter(r["id"] for r in runs)
    assert [i for i, n in ids.items() if n > 1] == [], "ran twice"
    seen = [r for r in runs if r["at"] < until or r["id"] in slot]
    unslotted = [r for r in seen if r["id"] not in slot]
    assert unslotted == [], f"ran with no slot: {unslotted[:5]}"
    early = [r for r in seen if r["at"] < slot[r["id"]] - DEFAULT_EARLY_SECONDS - 0.005]
    assert early == [], f"started before their slots: {early[:5]}"


def turns(log: FairLog, tenants: Mapping[str, int]) -> list[str]:
    """The tenants handed slots once every task had joined its queue (after the last
    wait: no tenant joins again with a fresh pass) while every one of ``tenants``
    still had a task waiting, in the order Redis handed them."""
    waiting: dict[str, set[str]] = {}
    last = max((n for n, e in enumerate(log.events) if isinstance(e, Wait)), default=-1)
    order = []
    for n, event in enumerate(log.events):
        if isinstance(event, Wait):
            waiting.setdefault(event.tenant, set()).add(event.task)
            continue
        if n > last and all(waiting.get(t) for t in tenants):
            order.append(event.tenant)
        waiting.get(event.tenant, set()).discard(event.task)
    return order


def shares(order: list[str], tenants: Mapping[str, int]) -> list[tuple[int, str, float]]:
    """Where a tenant of ``order`` (the turns) was more than one slot ahead of or behind
    its weighted share of the slots handed so far (stride scheduling stays within one):
    (turn, tenant, its count less its share)."""
    total = sum(tenants.values())
    counts: Counter[str] = Counter()
    off = []
    for n, tenant in enumerate(order, start=1):
        counts[tenant] += 1
        for name, weight in tenants.items():
            lag = counts[name] - n * weight / total
            if abs(lag) > 1.0 + 1e-9:
                off.append((n, name, lag))
    return off


def test_a_tenant_with_few_tasks_starts_at_once_beside_one_with_a_backlog(
    cluster: Cluster,
) -> None:
    task = cluster.app.tasks["fair.shared"]
    with fair_log(cluster.url, key_of("fair.shared")) as log:
        for n in range(1000):
            task.delay("A", n)
        wait_for(lambda: cluster.ingested("fair.shared", 1000), 60)
        for n in range(20):
            task.delay("B", n)
        wait_for(lambda: ran(cluster, "fair.shared", "B") >= 20, 120)
        until = time.time()  # the log sees every slot handed before this
    runs = cluster.runs("fair.shared")
    b = [r for r in runs if r["tenant"] == "B"]
    assert sorted(r["n"] for r in b) == list(range(20)), "each of B's tasks ran once"
    # 20/s: one slot every 50 ms, none started before its slot. Was: 20/s +- 1 over 10 s
    # of start times (a loaded machine starts fewer a second)
    slots = handed(log, 0.05)
    started_in_their_slots(runs, slots, until)
    # B is not starved: each of B's tasks waited, on Redis's order of events, behind
    # at most one of A's tasks for each of B's ahead of it, and one more (stride order;
    # without fair share, behind A's whole backlog: ~50 s). Was: each B start <= 3 s
    # after its send (the worker's clock: how soon a loaded machine parks and runs it)
    behind = passed_over(log, "B")
    assert behind == [], f"B's tasks waited behind more of A's: {len(behind)}, {behind[:3]}"
    assert sum(s.tenant == "B" for s in slots) >= 20
    cluster.drain("fair.shared")


def test_weights_share_a_saturated_funnel(cluster: Cluster) -> None:
    task = cluster.app.tasks["fair.weighted"]
    with fair_log(cluster.url, key_of("fair.weighted")) as log:
        for n in range(100):  # interleaved, so that both wait from the start
            task.delay("heavy", n)
            task.delay("heavy", n + 100)
            task.delay("heavy", n + 200)
            task.delay("light", n)
        wait_for(lambda: cluster.ingested("fair.weighted", 400), 60)
        weights = {"heavy": 3, "light": 1}
        # 100 turns while both wait, or light's all ran
        wait_for(
            lambda: (
                len(turns(log, weights)) >= 100 or ran(cluster, "fair.weighted", "light") == 100
            ),
            120,
        )
        until = time.time()  # the log sees every slot handed before this
    # weights 3:1 while both wait, once all had joined their queues: light takes one
    # slot of four, heavy three, each within one slot of that share at every turn; the
    # slots themselves at 20/s. Was: 15/s +- 1.5 and 5/s +- 0.5 of starts in an 8 s
    # window (how fast a loaded machine starts them)
    order = turns(log, weights)
    assert len(order) >= 20, f"too few turns while both waited: {order}"
    off = shares(order, weights)
    assert off == [], f"{len(off)} turns off their share, first {off[:3]}: {order[:40]}"
    ran_in_their_slots(cluster, log, "fair.weighted", until)


def test_higher_priority_waiting_tasks_start_first(cluster: Cluster) -> None:
    task = cluster.app.tasks["fair.priority"]
    with fair_log(cluster.url, key_of("fair.priority")) as log:
        for n in range(200):
            task.apply_async(("t", n), priority=9)  # the Redis transport: 9 is the lowest
        wait_for(lambda: cluster.ingested("fair.priority", 200), 60)
        for n in range(20):
            task.apply_async(("t", 1000 + n), priority=0)  # ... and 0 the highest
        wait_for(lambda: sum(r["n"] >= 1000 for r in cluster.runs("fair.priority")) == 20, 120)
        until = time.time()  # the log sees every slot handed before this
    # every slot handed while a high-priority task waited went to one: read in the
    # order Redis queued and served them. Was: <= 2 low-priority starts among the high
    # ones and < 100 before the last (start order on a loaded machine)
    urgent = {e.task for e in log.events if isinstance(e, Wait) and e.rank == 0}
    assert len(urgent) == 20, "the 20 high-priority tasks waited"
    waiting: set[str] = set()
    passed_over = []
    for event in log.events:
        if isinstance(event, Wait):
            waiting |= {event.task} & urgent
            continue
        if waiting and event.task not in urgent:
            passed_over.append(event)
        waiting.discard(event.task)
    assert passed_over == [], (
        f"low-priority tasks served while a high one waited: {len(passed_over)}, {passed_over[:3]}"
    )
    ran_in_their_slots(cluster, log, "fair.priority", until)


def test_many_tenants_with_one_task_each_release_at_the_limit(cluster: Cluster) -> None:
    task = cluster.app.tasks["fair.many"]
    with fair_log(cluster.url, key_of("fair.many")) as log:
        for n in range(600):
            task.delay(f"tenant-{n}", n)
        wait_for(lambda: len(cluster.runs("fair.many")) == 600, 180)
        until = time.time()  # the log sees every slot handed before this
    runs = cluster.runs("fair.many")
    assert sorted(r["n"] for r in runs) == list(range(600)), "each ran once"
    # 50/s: the slots one 20 ms apart (or handed when the funnel ran dry), each task
    # started in its own; every task one slot, each tenant's one. Was: 50/s +- 2.5 of
    # starts from when all were parked to the last (a loaded machine: 40.8/s, 32/s)
    slots = handed(log, 0.02)
    assert len({s.task for s in slots}) == 600
    started_in_their_slots(runs, slots, until)
