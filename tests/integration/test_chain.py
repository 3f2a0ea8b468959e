"""Funnels of different strategies, decided in order in one round trip (``chain.lua``):
the same answers and the same stored state as their scripts run one at a time, on every
backend; one EVALSHA on a Redis, NOSCRIPT survived; keys over several Cluster slots
fall back to one script each. This table is what checks each script's ``admitted``
Lua test against its Python decoding: were they to differ, the chain would stop at
another step than the one-at-a-time run, and the states would part."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_funnel import Funnel, RedisFunnel
from celery_funnel._limiter.decision import Reservation

NOW = 1_700_000_000.0
# Every period in hours, not seconds: the calls pass ``now``, but Redis expires the keys
# they write on its own clock (PX, the state's lifetime on the calls' clock); with
# periods of a second those lifetimes were 50-150 ms of real time, and a loaded machine
# between two calls let a key expire in one run and not the other (reset_after 0.1, not
# 0.15). The same maths an hour long: lifetimes of minutes.
H = 3600.0
Ruling = Callable[[Funnel], Any]
STEPS: dict[str, Callable[[str, float], Ruling]] = {
    "gcra": lambda k, t: lambda f: f.throttle(k, 1, 10, H, now=t),
    "reserve": lambda k, t: lambda f: f.reserve(k, 1, 10, H, ticket="t", max_wait=0.3 * H, now=t),
    "fixed_window": lambda k, t: lambda f: f.fixed_window(k, 3, H, now=t),
    "sliding_window": lambda k, t: lambda f: f.sliding_window(k, 3, H, now=t),
    "sliding_log": lambda k, t: lambda f: f.sliding_log(k, 3, H, now=t),
}
COMBOS = [
    *itertools.permutations(STEPS, 2),
    ("gcra", "fixed_window", "sliding_log"),
    ("sliding_window", "reserve", "gcra", "fixed_window"),
]


def admits(answer: Any) -> bool:
    return bool(answer.admitted if isinstance(answer, Reservation) else answer.allowed)


def run(funnel: Funnel, names: tuple[str, ...], prefix: str, t: float, chain: bool) -> list[Any]:
    steps = [STEPS[name](f"{prefix}:{name}", t) for name in names]
    if chain:
        return funnel._decide_in_order(steps, admits)
    return Funnel._decide_in_order(funnel, steps, admits)  # one script at a time


@pytest.mark.parametrize("names", COMBOS, ids="+".join)
def test_a_chain_decides_as_one_script_at_a_time_would(
    funnel: Funnel, key: str, names: tuple[str, ...]
) -> None:
    chained, alone = f"{{{key}}}:chained", f"{{{key}}}:alone"
    seen: set[tuple[int, bool]] = set()
    for n in range(24):  # 0.05 H apart: every funnel fills, refuses, then drains
        t = NOW + 0.05 * H * n
        answers = run(funnel, names, chained, t, chain=True)
        assert answers == run(funnel, names, alone, t, chain=False), f"call {n}"
        seen.add((len(answers), admits(answers[-1])))
    assert (len(names), True) in seen, "every step admitted, at times"
    assert any(n < len(names) and not ok for n, ok in seen), "a step before the last refused"


@pytest.mark.redis
def test_a_chain_is_one_round_trip_and_survives_script_flush(
    redis_funnel: RedisFunnel, redis_client: redis.Redis, key: str
) -> None:
    names = ("reserve", "fixed_window", "sliding_log")
    run(redis_funnel, names, key, NOW, chain=True)
    redis_client.script_flush()
    redis_client.config_resetstat()
    answers = run(redis_funnel, names, key, NOW + 0.01, chain=True)
    assert len(answers) == 3
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 2, "one, then one again after loading"
    assert sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_script")) == 1
    redis_client.config_resetstat()
    run(redis_funnel, names, key, NOW + 0.02 * H, chain=True)
    assert redis_client.info("commandstats")["cmdstat_evalsha"]["calls"] == 1


def test_keys_over_several_cluster_slots_run_one_script_each(funnel: Funnel, key: str) -> None:
    names = ("gcra", "fixed_window")
    steps = [STEPS[name](f"{key}:{n}:{name}", NOW) for n, name in enumerate(names)]
    assert all(admits(a) for a in funnel._decide_in_order(steps, admits))
    if isinstance(funnel, RedisFunnel) and hasattr(funnel.client, "keyslot"):
        assert not funnel._one_slot([f"{key}:0:gcra", f"{key}:1:fixed_window"])
