"""``Funnel.throttle_many``: many GCRA decisions in one round trip, each the same as
``throttle`` would give, on every backend (memory, each Redis, a Redis Cluster)."""

from __future__ import annotations

import pytest
import redis

from celery_funnel import ConfigurationError, Funnel, RedisFunnel, Shape

NOW = 1_700_000_000.0


def test_a_batch_decides_as_single_calls_would(funnel: Funnel, key: str) -> None:
    shapes = [Shape(f"{key}:{n % 3}", 1, 10, 1, 1 + n % 2) for n in range(9)]
    batched = funnel.throttle_many(shapes, now=NOW)
    for n in range(3):
        funnel.reset(f"{key}:{n}")
    single = [funnel.throttle(s.key, s.max_burst, s.count, s.period, s.quantity, now=NOW)
              for s in shapes]  # fmt: skip
    assert batched == single
    assert [d.limited for d in batched[:3]] == [False, False, False]
    assert any(d.limited for d in batched)


def test_an_empty_batch_decides_nothing(funnel: Funnel) -> None:
    assert funnel.throttle_many([]) == []


def test_a_bad_shape_sends_nothing(funnel: Funnel, key: str) -> None:
    with pytest.raises(ConfigurationError, match="max_burst"):
        funnel.throttle_many([Shape(key, 0, 10, 1), Shape(f"{key}:x", -1, 10, 1)], now=NOW)
    assert not funnel.throttle(key, 0, 10, 1, 0, now=NOW).limited, "the first was not taken"


@pytest.mark.redis
def test_a_batch_is_one_round_trip_and_survives_script_flush(
    redis_funnel: RedisFunnel, redis_client: redis.Redis, key: str
) -> None:
    shapes = [Shape(f"{key}:{n}", 5, 10, 1) for n in range(20)]
    redis_funnel.throttle_many(shapes)
    redis_client.script_flush()
    redis_client.config_resetstat()
    decisions = redis_funnel.throttle_many(shapes)
    assert [d.remaining for d in decisions] == [4] * 20
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 40, "20, then 20 again after loading"
    loads = sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_script"))
    assert loads == 1, "SCRIPT LOAD (Redis 7: script|load)"
