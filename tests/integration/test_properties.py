"""Properties of every limiter, checked with hypothesis on every backend.

Times are integer microseconds after T0 and passed as ``now``, so each example is
exact and replayable; every example uses fresh keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_funnel import Decision, Funnel, MemoryFunnel
from celery_funnel._limiter.strategies._common import emission_us
from tests.tables import T0

US = 1_000_000
PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

shapes = st.tuples(
    st.integers(0, 5),  # max_burst
    st.integers(1, 10),  # count
    st.sampled_from([1, 2.5, 60]),  # period, seconds
)
# Gaps on and one microsecond either side of multiples of 50 ms, where every shape
# below has its boundaries: off-by-one errors show up there.
near_boundaries = st.builds(
    lambda steps, nudge: max(steps * 50_000 + nudge, 0),
    st.one_of(st.just(0), st.integers(0, 4), st.integers(0, 40)),  # often quick: funnels fill
    st.sampled_from([-1, 0, 0, 1]),
)
events = st.lists(
    st.tuples(st.one_of(st.integers(0, 3 * US), near_boundaries), st.integers(0, 7)),
    min_size=1,
    max_size=40,
)


def at(offset_us: int) -> float:
    return (T0 * US + offset_us) / US


@PROPERTY
@given(shape=shapes, history=events)
def test_gcra_never_admits_more_than_capacity_plus_rate_times_t(
    funnel: Funnel, shape: tuple[int, int, float], history: list[tuple[int, int]]
) -> None:
    max_burst, count, period = shape
    key, t, limit = uuid.uuid4().hex, emission_us(count, period), max_burst + 1
    admitted: list[tuple[int, int]] = []
    clock = 0
    for gap, quantity in history:
        clock += gap
        if funnel.throttle(key, max_burst, count, period, quantity, now=at(clock)).allowed:
            admitted.append((clock, quantity))
    for i, (start, _) in enumerate(admitted):
        for end, _ in admitted[i:]:
            units = sum(q for when, q in admitted if start <= when <= end)
            assert units <= limit + (end - start) // t


# name -> call(funnel, key, quantity, now): each limiter with a small fixed shape
LIMITERS: dict[str, Callable[[Funnel, str, int, float], Decision]] = {
    "gcra": lambda f, k, q, now: f.throttle(k, 2, 3, 1, q, now=now),
    "fixed_window": lambda f, k, q, now: f.fixed_window(k, 4, 2, q, now=now),
    "sliding_log": lambda f, k, q, now: f.sliding_log(k, 4, 2, q, now=now),
    "sliding_window": lambda f, k, q, now: f.sliding_window(k, 4, 2, q, windows=4, now=now),
}


@pytest.mark.parametrize("limiter", list(LIMITERS))
@PROPERTY
@given(history=events)
def test_retry_after_is_exact(funnel: Funnel, limiter: str, history: list[tuple[int, int]]) -> None:
    """Refused with retry_after r: refused again 1 us before now + r, admitted at it."""
    call, key, clock = LIMITERS[limiter], uuid.uuid4().hex, 0
    for gap, quantity in history:
        clock += gap
        decision = call(funnel, key, quantity, at(clock))
        if not decision.limited or decision.retry_after < 0:
            continue
        wait = round(decision.retry_after * US)
        assert wait > 0
        assert call(funnel, key, quantity, at(clock + wait - 1)).limited
        clock += wait
        assert call(funnel, key, quantity, at(clock)).allowed


operations = st.lists(
    st.tuples(
        st.sampled_from(
            ["throttle", "reserve", "redeem", "hold", "fixed", "partial", "log", "window"]
        ),
        near_boundaries,
        st.sampled_from([None, None, -1, 0]),  # or: jump to the last retry_after (-1 us)
        st.integers(0, 6),
        st.sampled_from(["a", "b", "c"]),
    ),
    min_size=1,
    max_size=30,
)


def apply(funnel: Funnel, key: str, op: str, now: float, q: int, ticket: str) -> tuple[Any, ...]:
    if op == "throttle":
        return tuple(funnel.throttle(key, 2, 5, 1, q % 5, now=now))  # mostly <= limit 3
    if op in ("reserve", "redeem"):
        redeem = op == "redeem"
        return tuple(funnel.reserve(key, 2, 5, 1, max(q, 1), ticket=ticket, redeem=redeem, now=now))
    if op == "hold":
        return (funnel.hold(key, 2, 5, 1, (q + 1) * 0.1, now=now),)
    if op in ("fixed", "partial"):
        return tuple(funnel.fixed_window(key, 5, 1, q, partial=op == "partial", now=now))
    if op == "log":
        return tuple(funnel.sliding_log(key, 5, 1, q, now=now))
    return tuple(funnel.sliding_window(key, 5, 1, q, windows=3, partial=q % 2 == 1, now=now))


# operations that share one funnel key
FAMILY = {
    "reserve": "gcra",
    "redeem": "gcra",
    "throttle": "gcra",
    "hold": "gcra",
    "partial": "fixed",
}


@pytest.mark.redis
@settings(PROPERTY, max_examples=150)
@given(ops=operations)
def test_lua_scripts_and_python_twins_agree(
    redis_funnel: Funnel, ops: list[tuple[str, int, int | None, int, str]]
) -> None:
    """The same operations give the same answers from Redis and from memory."""
    memory, base, clock, retry_us = MemoryFunnel(), uuid.uuid4().hex, 0, 0
    for op, gap, snap, quantity, ticket in ops:
        clock += gap if snap is None or retry_us <= 0 else retry_us + snap
        key = f"{base}:{FAMILY.get(op, op)}"
        expected = apply(memory, key, op, at(clock), quantity, ticket)
        assert apply(redis_funnel, key, op, at(clock), quantity, ticket) == expected, op
        retry_us = round(expected[{6: 3, 1: 0}.get(len(expected), 1)] * US)


def water_level_reference(capacity: int, count: int, period: float) -> Callable[[int, int], bool]:
    """Seed 003's water-level bucket with exact fractions instead of floats and
    whole-second TIME: admit while water + quantity <= capacity."""
    rate = Fraction(count) / Fraction(round(period * US))  # units per microsecond
    water, last = Fraction(0), 0

    def admit(now_us: int, quantity: int) -> bool:
        nonlocal water, last
        water, last = max(Fraction(0), water - (now_us - last) * rate), now_us
        if water + quantity <= capacity:
            water += quantity
            return True
        return False

    return admit


@PROPERTY
@given(
    capacity=st.integers(1, 6),
    count=st.sampled_from([1, 2, 4, 5, 10]),
    period=st.sampled_from([1, 2, 60]),
    history=events,
)
def test_seed_003_water_level_is_the_gcra_funnel(
    funnel: Funnel, capacity: int, count: int, period: int, history: list[tuple[int, int]]
) -> None:
    """Computed exactly, the water level is (TAT - now) / T: the same decisions."""
    reference, key, clock = water_level_reference(capacity, count, period), uuid.uuid4().hex, 0
    for gap, quantity in history:
        clock += gap
        decision = funnel.water_level(key, capacity, count, period, quantity, now=at(clock))
        assert decision.allowed == reference(clock, quantity)


@PROPERTY
@given(
    arrivals=st.lists(st.integers(0, 300_000), min_size=1, max_size=25),
    jitters=st.lists(st.integers(-60_000, 400_000), min_size=1, max_size=25),
)
def test_reservations_make_progress_and_never_burst(
    funnel: Funnel, arrivals: list[int], jitters: list[int]
) -> None:
    """Callers book slots and come back early, on time or late (by the jitters); each
    widens its late grace 2x whenever its ticket went stale, as the Celery layer does.
    Every caller starts, and starts respect limit + (t + late + early) / T in every
    interval t, late being the widest grace used."""
    key, t, limit, early = uuid.uuid4().hex, 100_000, 2, 50_000  # 10/s, max_burst 1
    pending: list[tuple[int, str, int]] = []  # (time, ticket, times stale; -1 = new)
    clock = 0
    for number, gap in enumerate(arrivals):
        clock += gap
        pending.append((clock, f"task-{number}", -1))
    starts: list[int] = []
    widest, turns = t, 0
    while pending and turns < 500:
        turns += 1
        pending.sort()
        when, ticket, stale = pending.pop(0)
        late = t * 2 ** max(stale, 0)
        answer = funnel.reserve(
            key, limit - 1, 10, 1, ticket=ticket, redeem=stale >= 0, late=late / US, now=at(when)
        )
        if answer.admitted:
            starts.append(when)
            widest = max(widest, late)
            continue
        jitter = jitters[turns % len(jitters)]
        wait = round(answer.delay * US)
        # early by at most half the wait: a task cannot run before it was re-queued
        back = when + max(wait + jitter, wait // 2, 1)
        # back after slot + late (slot = when + delay): the ticket went stale
        pending.append((back, ticket, 0 if stale < 0 else stale + (jitter > late)))
    assert not pending, "every caller starts in the end"
    starts.sort()
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= limit + (starts[j] - first + widest + early) // t
