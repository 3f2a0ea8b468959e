"""Eight processes hammer one funnel on a real Redis: the admitted count is exactly
what the maths allows, and concurrent bookings get distinct, evenly spaced slots."""

from __future__ import annotations

import itertools
import multiprocessing
import uuid

import pytest
import redis

from celery_funnel import RedisFunnel
from celery_funnel._limiter.keys import companion_key
from celery_funnel._limiter.strategies._common import emission_us

pytestmark = [pytest.mark.redis, pytest.mark.slow]
PROCESSES = 8


def _hammer(url: str, method: str, key: str, attempts: int, barrier: object) -> int:
    funnel = RedisFunnel.from_url(url)
    barrier.wait()  # type: ignore[attr-defined]
    admitted = 0
    for attempt in range(attempts):
        if method == "throttle":
            # limit 100, one unit per hour: nothing leaks during the test
            admitted += funnel.throttle(key, 99, 1, 3600).allowed
        elif method == "fixed_window":
            admitted += funnel.fixed_window(key, 100, 3600, now=1_800_000_000.0).granted
        elif method == "sliding_log":
            admitted += funnel.sliding_log(key, 100, 3600).granted
        elif method == "sliding_window":
            admitted += funnel.sliding_window(key, 100, 3600, windows=6).granted
        else:  # reserve, 1/s: every call is admitted or books a slot (none passes mid-run)
            booking = funnel.reserve(key, 0, 1, 1, ticket=f"{attempt}-{uuid.uuid4()}")
            admitted += booking.admitted
    funnel.client.close()
    return admitted


def _run(url: str, method: str, key: str, attempts: int) -> int:
    context = multiprocessing.get_context("spawn")
    barrier = context.Manager().Barrier(PROCESSES)
    with context.Pool(PROCESSES) as pool:
        counts = pool.starmap(_hammer, [(url, method, key, attempts, barrier)] * PROCESSES)
    return sum(counts)


@pytest.mark.parametrize("method", ["throttle", "fixed_window", "sliding_log", "sliding_window"])
def test_eight_processes_admit_exactly_the_limit(redis_url: str, key: str, method: str) -> None:
    assert _run(redis_url, method, key, attempts=40) == 100


def test_concurrent_bookings_get_distinct_evenly_spaced_slots(
    redis_url: str, redis_client: redis.Redis, key: str
) -> None:
    admitted = _run(redis_url, "reserve", key, attempts=25)
    tickets: list[tuple[bytes, float]] = redis_client.zrange(  # type: ignore[assignment]
        companion_key(key, "tickets"), 0, -1, withscores=True
    )
    slots = sorted(int(score) for _, score in tickets)
    assert admitted + len(slots) == PROCESSES * 25
    steps = {b - a for a, b in itertools.pairwise(slots)}
    assert steps == {emission_us(1, 1)}  # back to back, one emission interval apart
