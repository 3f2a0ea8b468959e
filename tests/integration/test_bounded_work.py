"""Bounded work per call: the stale-ticket sweep and the sliding log's entries, on every
backend (the Lua scripts and their Python twins alike)."""

from __future__ import annotations

import pytest

from celery_funnel import ConfigurationError, Funnel, Limit, MemoryFunnel, Rate, RedisFunnel
from celery_funnel._limiter.keys import tickets_key
from celery_funnel._limiter.strategies.reservation import SWEEP
from celery_funnel._limiter.strategies.sliding_log import MAX_LOG_LIMIT


def _zcard(funnel: Funnel, key: str) -> int:
    if isinstance(funnel, MemoryFunnel):
        return funnel.store.zcard(key)
    assert isinstance(funnel, RedisFunnel)
    return int(funnel.client.zcard(key))


def test_a_booking_sweeps_a_bounded_number_of_stale_tickets(funnel: Funnel, key: str) -> None:
    stale = SWEEP * 2 + 50
    for i in range(stale):  # one per 10 s from t=1000: the last slot is ~3500
        funnel.reserve(key, 0, 1, 10, ticket=f"t{i}", late=0.001, now=1000.0)
    assert _zcard(funnel, tickets_key(key)) == stale - 1  # the first was admitted
    funnel.throttle(key, 0, 1, 10, now=5000.0)  # every slot long past: all stale
    booked = funnel.reserve(key, 0, 1, 10, ticket="new", late=0.001, now=5000.0)
    assert booked.booked
    assert _zcard(funnel, tickets_key(key)) == stale - 1 - SWEEP + 1
    funnel.throttle(key, 0, 1, 10, now=5010.0)
    funnel.reserve(key, 0, 1, 10, ticket="newer", late=0.001, now=5010.0)
    assert _zcard(funnel, tickets_key(key)) == stale - 1 - 2 * SWEEP + 2


def test_the_sliding_log_limit_is_bounded(funnel: Funnel, key: str) -> None:
    with pytest.raises(ConfigurationError, match=f"at most {MAX_LOG_LIMIT}"):
        funnel.sliding_log(key, MAX_LOG_LIMIT + 1, 60)
    with pytest.raises(ConfigurationError, match="use sliding_window or gcra"):
        Limit(Rate.parse(f"{MAX_LOG_LIMIT + 1}/m"), strategy="sliding_log")
    refused = funnel.sliding_log(key, 3, 60, 10**6)  # above the limit: nothing written
    assert (refused.limited, refused.retry_after, refused.granted) == (True, -1.0, 0)
    assert _zcard(funnel, key) == 0
    full = funnel.sliding_log(key, MAX_LOG_LIMIT, 60, MAX_LOG_LIMIT)
    assert full.granted == MAX_LOG_LIMIT
