"""The wait policy (``_config.waiting``): one place chooses how a refused run waits, with
the boundaries the gate has always had (a wait exactly ``funnel_park_after`` long is not
parked; a hold exactly as long as its delivery has left is held)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from celery_funnel._config.countdown import CountdownPolicy
from celery_funnel._config.waiting import (
    LOOK_SECONDS,
    PAUSED_HOLD_SECONDS,
    PAUSED_PARK_SECONDS,
    WAITER_SECONDS,
    WaitPolicy,
    Way,
)

POLICY = WaitPolicy.of(5.0, CountdownPolicy(cap=1800.0))
QUORUM = WaitPolicy.of(5.0, CountdownPolicy(cap=1800.0, whole_seconds=True))
INF = float("inf")


def _on() -> bool:
    return True


def _off() -> bool:
    return False


def _never() -> bool:
    raise AssertionError("parking asked for a queued run")


def test_park_after_is_capped_by_the_countdown_cap() -> None:
    assert WaitPolicy.of(3600.0, CountdownPolicy(cap=60.0)).park_after == 60.0
    assert POLICY.park_after == 5.0


@pytest.mark.parametrize(
    ("delay", "until", "parking", "outage", "parks"),
    [
        (5.0, INF, _on, False, False),  # exactly park_after: not parked
        (5.01, INF, _on, False, True),
        (10.0, 10.0, _on, False, False),  # ends exactly at expiry: not parked
        (10.0, 10.01, _on, False, True),
        (10.0, INF, _off, False, False),
        (10.0, INF, _on, True, False),  # an outage back-off is never parked
    ],
)
def test_parks(
    delay: float, until: float, parking: Callable[[], bool], outage: bool, parks: bool
) -> None:
    assert POLICY.parks(delay, until, parking=parking, outage=outage) is parks


@pytest.mark.parametrize(
    ("policy", "delay", "hold", "left", "outage", "way"),
    [
        (POLICY, 3.0, 3.0, 3.0, False, Way.HOLD),  # a hold exactly as long as left: held
        (POLICY, 3.0, 3.0, 2.99, False, Way.PUBLISH),
        (POLICY, 3.0, 3.0, 2.99, True, Way.BACK_OFF),
        (QUORUM, 0.99, 0.99, 0.0, False, Way.HOLD),  # too short to publish: in place
        (QUORUM, 1.0, 1.0, 0.0, False, Way.PUBLISH),
        (POLICY, 10.0, 10.0, 100.0, False, Way.PARK),
        (POLICY, 10.0, 10.0, 100.0, True, Way.HOLD),
    ],
)
def test_way(
    policy: WaitPolicy, delay: float, hold: float, left: float, outage: bool, way: Way
) -> None:
    got = policy.way(delay, hold, hold_left=left, until_expiry=INF, parking=_on, outage=outage)
    assert got is way


def test_a_queued_run_is_parked_without_asking_about_parking() -> None:
    way = POLICY.way(0.0, 0.0, hold_left=1.0, until_expiry=INF, parking=_never, queued=True)
    assert way is Way.PARK


def test_in_task() -> None:
    assert POLICY.in_task(0.5, eager=False) is Way.PUBLISH
    assert POLICY.in_task(100.0, eager=True) is Way.HOLD
    assert QUORUM.in_task(0.99, eager=False) is Way.HOLD
    assert QUORUM.in_task(1.0, eager=False) is Way.PUBLISH


def test_seats_and_pauses() -> None:
    assert POLICY.for_seat(parking=True) == (Way.WAITER, WAITER_SECONDS)
    assert POLICY.for_seat(parking=False) == (Way.HOLD, LOOK_SECONDS)
    assert POLICY.paused(parking=True) == PAUSED_PARK_SECONDS
    assert POLICY.paused(parking=False) == PAUSED_HOLD_SECONDS
