#!/usr/bin/env python3
"""Bounded work per call: the worst case of one call, in Redis server time.

- sliding log: one call of quantity q on a limit of q (q entries written at once), for
  q = 10 000 (the bound) and 1 000 000 (refused as a configuration since the bound),
  and a quantity of 1 000 000 on a limit of 3 (refused before any entry is written);
- reservation: one booking over N stale tickets (the sweep), N = 10 000;
- sliding window: server us per call at 10 and 100 sub-windows, and the client-side
  cost of building one call (key names and arguments) at 10 and 100 sub-windows.

Server time is ``INFO commandstats`` (EVALSHA usec, the script's inner calls included).

    python bench/bounded.py [--redis URL]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import redis

sys.path.insert(0, str(HERE.parent))

from bench.memory import capture
from celery_funnel import ConfigurationError, RedisFunnel
from celery_funnel.testing import RedisServer


def server_ms(client: redis.Redis, call: Callable[[], Any]) -> str:
    """Server milliseconds of one call's scripts, or why it was refused."""
    client.config_resetstat()
    try:
        call()
    except ConfigurationError as exc:
        return f"refused: {str(exc)[:60]}..."
    stats = client.info("commandstats")
    usec = sum(v["usec"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    return f"{usec / 1000:.3f} ms"


def sweep(funnel: RedisFunnel, stale: int) -> str:
    """One booking over ``stale`` stale tickets."""
    key = "b:{sweep}"
    with funnel.client.pipeline(transaction=False) as pipe:
        for i in range(stale):  # tickets scored in the past: all stale for the booking
            pipe.zadd("b:{sweep}#tickets", {f"t{i}": 1_000_000 + i})
            pipe.zadd("b:{sweep}:tickets", {f"t{i}": 1_000_000 + i})  # the old layout
        pipe.execute()
    funnel.throttle(key, 0, 1, 3600)  # full: the next call books
    return server_ms(
        cast(redis.Redis, funnel.client), lambda: funnel.reserve(key, 0, 1, 3600, ticket="new")
    )


def window_server_us(client: redis.Redis, funnel: RedisFunnel, windows: int) -> float:
    for _ in range(200):
        funnel.sliding_window(f"b:sw{windows}", 10**6, 60, windows=windows)
    client.config_resetstat()
    calls = 3000
    for _ in range(calls):
        funnel.sliding_window(f"b:sw{windows}", 10**6, 60, windows=windows)
    stats = client.info("commandstats")
    return float(stats["cmdstat_evalsha"]["usec"]) / calls


def build_us(windows: int) -> float:
    """Client-side microseconds to build one sliding-window call (no Redis)."""
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(2000):
            capture(lambda f: f.sliding_window("b:key", 100, 60, windows=windows))
        samples.append((time.perf_counter() - start) / 2000 * 1e6)
    return statistics.median(samples)


def run(url: str) -> list[tuple[str, str]]:
    client = redis.Redis.from_url(url)
    client.flushall()
    funnel = RedisFunnel(client)
    rows = [
        ("sliding log: quantity 10 000 on a limit of 10 000",
         server_ms(client, lambda: funnel.sliding_log("b:log1", 10_000, 60, 10_000))),
        ("sliding log: quantity 1 000 000 on a limit of 1 000 000",
         server_ms(client, lambda: funnel.sliding_log("b:log2", 10**6, 60, 10**6))),
        ("sliding log: quantity 1 000 000 on a limit of 3",
         server_ms(client, lambda: funnel.sliding_log("b:log3", 3, 60, 10**6))),
        ("reserve: one booking over 10 000 stale tickets", sweep(funnel, 10_000)),
    ]  # fmt: skip
    for windows in (10, 100):
        rows.append((
            f"sliding window, {windows} sub-windows: server us per call",
            f"{window_server_us(client, funnel, windows):.2f}",
        ))  # fmt: skip
        rows.append((
            f"sliding window, {windows} sub-windows: client us to build a call",
            f"{build_us(windows):.2f}",
        ))  # fmt: skip
    client.close()
    return rows


def table(rows: list[tuple[str, str]], version: str) -> str:
    head = [f"Redis {version}, loopback, one call each", "", "| case | cost |", "| --- | ---: |"]
    return "\n".join(head + [f"| {case} | {cost} |" for case, cost in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description="bounded work per call")
    parser.add_argument("--redis", help="use this Redis (it is flushed!) not a private one")
    args = parser.parse_args()
    if args.redis:
        version = redis.Redis.from_url(args.redis).info("server")["redis_version"]
        print(table(run(args.redis), version))
        return
    with RedisServer() as server:
        print(table(run(server.url), server.version))


if __name__ == "__main__":
    main()
