"""Allowances (``funnel_allowance``, on by default) on real workers and a real
Redis (issue 44): 4 ``celery worker`` processes on one 200/s funnel of capacity 40 (k =
10), tasks offered first below the rate (the funnel far from full: runs admitted on
units, fewer calls than runs), then all at once (near full: every run decided alone).
The most starts in any window stays within the bound docs/semantics.md states, rate x w
+ capacity + k x workers. A 20/s funnel (k = 1) is decided run by run, exactly as
before, and so is any funnel with ``funnel_allowance = False``."""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import pytest
import redis

from celery_funnel._limiter.keys import limit_key
from celery_funnel._limiter.rate import Rate
from celery_funnel._limiter.strategies.allowance import units
from celery_funnel._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from celery_funnel.testing import CeleryWorkers, RedisServer, peak
from tests.integration.conftest import ROOT
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for
from tests.redis_monitor import FunnelLog, Write, funnel_log, started_early

pytestmark = [pytest.mark.redis, pytest.mark.slow]

RATE, CAPACITY, WORKERS = Rate.parse("200/s"), 40, 4
K = units(RATE, CAPACITY)
STEADY, FLOOD = 600, 1200  # runs offered at 150/s, then at once


def _evalsha(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def _ran(client: redis.Redis, count: int) -> bool:
    return int(client.llen("runs")) >= count


def _offer(app: Any, count: int, per_second: float | None) -> None:
    with app.producer_or_acquire() as producer:
        start = time.monotonic()
        for n in range(count):
            if per_second is not None:
                time.sleep(max(0.0, start + n / per_second - time.monotonic()))
            app.tasks["proj.plain"].apply_async((n,), producer=producer)


def _run(
    url: str,
    limit: dict[str, Any],
    workers: int,
    offers: list[tuple[int, float | None]],
    conf: dict[str, Any] | None = None,
) -> tuple[list[float], list[int]]:
    """``workers`` real workers on ``proj.plain`` under ``limit`` and ``conf`` (None:
    the defaults), offered each ``(count, per second)`` in turn (None: at once), each
    waited for: the starts, and the script calls each offer made."""
    limits = {"proj.plain": limit}
    env = {
        "FUNNEL_TEST_BROKER": url,
        "FUNNEL_TEST_REDIS": url,
        "FUNNEL_TEST_LIMITS": json.dumps(limits),
    }
    if conf is not None:
        env["FUNNEL_TEST_CONF"] = json.dumps(conf)
    app = make_app(url, url, funnel_limits=limits)
    client = redis.Redis.from_url(url)
    calls, total = [], 0
    try:
        with CeleryWorkers(
            "tests.integration.proj", workers, env, "-c", "2", "-Q", "proj", cwd=ROOT
        ):
            for count, per_second in offers:
                before, total = _evalsha(client), total + count
                _offer(app, count, per_second)
                wait_for(partial(_ran, client, total), timeout=30 + count / 20)
                calls.append(_evalsha(client) - before)
        recorded = runs(url)
    finally:
        client.close()
        close_app(app)
    assert len({r["id"] for r in recorded}) == len(recorded) == total  # each ran once
    return [r["at"] for r in recorded], calls


def test_starts_stay_within_the_allowance_bound_on_four_workers(broker: RedisServer) -> None:
    """Four workers taking units in batches (k = 10) from a 200/s funnel of capacity 40:
    read on Redis's clock from the funnel's own writes (each moves the TAT one unit, or
    k), the units taken in any window stay within the funnel's bound (rate x window +
    capacity), every run had a unit taken before it started, and the runs took no more
    units than were taken. Was: starts (the workers' clock) within that bound plus the
    k x workers units held: a loaded machine bunches starts that waited for the CPU."""
    assert K == 10
    limit = {"rate": "200/s", "capacity": CAPACITY}
    unit, tau = RATE.period / RATE.count, CAPACITY * RATE.period / RATE.count
    with funnel_log(broker.url, limit_key("funnel:", "proj.plain")) as log:
        starts, calls = _run(broker.url, limit, WORKERS, [(STEADY, 150.0), (FLOOD, None)])
    steady_calls = calls[0]
    assert steady_calls < STEADY, "no run was admitted on a unit held"
    taken: list[float] = []  # when each unit was taken: admitted then, or its slot
    for write, moved in log.steps():
        taken += [max(write.at, write.tat - tau)] * round(moved / unit)
    taken.sort()
    assert len(taken) >= len(starts), f"{len(starts)} runs on {len(taken)} units"
    for window in (0.25, 1.0, 5.0):
        bound = RATE.per_second * window + CAPACITY
        most = peak(taken, window)
        print(f"window {window} s: most units taken {most}, bound {bound:g} (starts: the"
              f" most {peak(starts, window)}); calls while steady {steady_calls} for"
              f" {STEADY} runs")  # fmt: skip
        assert most <= bound, (window, most, bound)
    early = started_early(starts, taken, DEFAULT_EARLY_SECONDS)
    assert early == [], f"runs started before a unit was taken for them: {early[:5]}"


def test_a_funnel_under_40_a_second_is_decided_run_by_run(broker: RedisServer) -> None:
    """20/s (k = 1): no allowance; every run has its own call, each decision moves the
    funnel one unit, and the most slots in any second, on Redis's clock, is the exact
    funnel's (rate + capacity)."""
    assert units(Rate.parse("20/s"), 1) <= 1
    with funnel_log(broker.url, limit_key("funnel:", "proj.plain")) as log:
        _, calls = _run(broker.url, {"rate": "20/s", "capacity": 1}, 2, [(60, None)])
    writes = log.decisions()
    assert calls[0] >= 60
    assert len(writes) >= 60, "a slot (admitted now, or booked) for every run"
    assert _takes(log, 0.05) == [], "one unit at a time"
    # capacity 1: a decision's slot is its TAT less one unit (admitted then, or booked)
    assert peak([w.tat - 0.05 for w in writes], 1.0) <= 21


def test_allowance_off_decides_every_run_alone(broker: RedisServer) -> None:
    """``funnel_allowance = False`` on the same fast funnel: a call per run."""
    limit = {"rate": "200/s", "capacity": CAPACITY}
    _, calls = _run(broker.url, limit, 2, [(200, 150.0)], {"funnel_allowance": False})
    assert calls[0] >= 200


def _takes(log: FunnelLog, unit: float) -> list[Write]:
    """The writes of the funnel that took more than one unit at once (an allowance): a
    run decided alone moves it one ``unit`` (``FunnelLog.steps``)."""
    return [write for write, moved in log.steps() if moved > 1.5 * unit]


def test_units_are_taken_only_while_the_funnel_stays_half_free(broker: RedisServer) -> None:
    """Every allowance the workers took, read on Redis's clock from the funnel's own
    writes (``tests.redis_monitor``): the TAT it left is at most tau / 2 (half the
    capacity's worth, 0.1 s here) ahead of when the script ran, below the rate and at
    once; a funnel charged until full would leave it up to tau ahead."""
    limit = {"rate": "200/s", "capacity": CAPACITY}
    unit, tau = RATE.period / RATE.count, CAPACITY * RATE.period / RATE.count
    with funnel_log(broker.url, limit_key("funnel:", "proj.plain")) as log:
        _run(broker.url, limit, 2, [(300, 150.0), (600, None)])
    writes = log.decisions()
    takes = _takes(log, unit)
    ahead = max(w.tat - w.at for w in takes)
    print(f"{len(writes)} writes, {len(takes)} allowances; the most ahead {ahead:.4f} s")
    assert takes, "units were taken (k = 10)"
    assert ahead <= tau / 2, f"an allowance left the funnel {ahead:.4f} s ahead (tau {tau})"
