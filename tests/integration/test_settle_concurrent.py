"""Settling under 8 concurrent processes: each run is charged its estimate, then
settles twice (the second amount is the run's); afterwards the funnel holds exactly
the sum of what the runs settled last: no give-back lost or applied twice. On a
standalone Redis and on a Redis Cluster, through real processes and connections."""

from __future__ import annotations

import multiprocessing
import uuid

import pytest

from celery_funnel import RedisFunnel, Settle
from tests.conftest import CLUSTER, SERVERS, ServerPool
from tests.tables import T0

pytestmark = [pytest.mark.redis]

PROCESSES, RUNS, ESTIMATE = 8, 25, 250
COUNT, PERIOD = 1, 1.0  # T = 1 s per unit; a clock held at T0: nothing drains
MAX_BURST = 10**6


def first_amount(worker: int, run: int) -> int:
    return 50 + (worker * 31 + run * 17) % 201


def last_amount(worker: int, run: int) -> int:
    return 50 + (worker * 13 + run * 29) % 201


def _runs(url: str, key: str, other: str, worker: int) -> None:
    funnel = RedisFunnel.from_url(url, socket_timeout=10)
    try:
        for run in range(RUNS):
            assert not funnel.throttle(key, MAX_BURST, COUNT, PERIOD, ESTIMATE, now=T0).limited
            assert not funnel.throttle(other, MAX_BURST, COUNT, PERIOD, 1, now=T0).limited
            first = first_amount(worker, run)
            funnel.settle_all(
                [Settle(key, COUNT, PERIOD, first - ESTIMATE), Settle(other, COUNT, PERIOD, 1)],
                now=T0,
            )
            funnel.settle(key, COUNT, PERIOD, last_amount(worker, run) - first, now=T0)
    finally:
        funnel.client.close()


@pytest.mark.parametrize("where", ["standalone", *CLUSTER])
def test_eight_processes_settle_to_the_sum_of_their_amounts(
    server_pool: ServerPool, where: str
) -> None:
    url = server_pool.cluster_url() if where == "cluster" else server_pool.url(next(iter(SERVERS)))
    tag = f"{{settle-{where}-{uuid.uuid4().hex}}}"
    key, other = f"{tag}:a", f"{tag}:b"  # the second is settled alongside, same slot
    funnel = RedisFunnel.from_url(url, socket_timeout=10)
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_runs, args=(url, key, other, w)) for w in range(PROCESSES)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(120)
    assert [p.exitcode for p in workers] == [0] * PROCESSES
    expected = sum(last_amount(w, r) for w in range(PROCESSES) for r in range(RUNS))
    held = funnel.throttle(key, MAX_BURST, COUNT, PERIOD, 0, now=T0).reset_after
    assert held == expected * PERIOD / COUNT
    both = funnel.throttle(other, MAX_BURST, COUNT, PERIOD, 0, now=T0).reset_after
    assert both == 2 * PROCESSES * RUNS
    funnel.reset(key)
    funnel.reset(other)
    funnel.client.close()
