#!/usr/bin/env python3
"""The Celery layer on real workers: shared-limit accuracy, re-queues, and overhead.

1. Accuracy: 2 worker processes (prefork, concurrency 2) on a private Redis broker,
   40 tasks through one 10/s funnel of capacity 1, with reservation on and off, and the
   same load on a plain task limited by ``funnel_limits``: tasks lost, run twice,
   admitted rate, the most starts in any one second, re-queues per deferred task.
2. Overhead: never-limited FunnelTask no-ops against plain no-ops on the same worker
   and broker (prefork and threads pools, concurrency 2), in alternating rounds of one run; tasks per
   second and the median ratio of neighbouring rounds.

    python bench/celery.py [--tasks 40] [--noops 300] [--rounds 16]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, where this very file
# would shadow the celery package.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import json
import statistics
import time
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._table import markdown, spread
from celery_funnel.testing import CeleryWorkers, RedisServer, peak
from tests.integration.proj import make_app, runs


def accuracy(url: str, task: str, count: int, reservation: bool, limits: Any) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.flushall()
    env = {"FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url,
           "FUNNEL_TEST_RESERVATION": "1" if reservation else "0"}  # fmt: skip
    if limits:
        env["FUNNEL_TEST_LIMITS"] = json.dumps(limits)
    app = make_app(url, url, funnel_limits=limits or {})
    with CeleryWorkers("tests.integration.proj", 2, env, "-c", "2", "-Q", "proj", cwd=str(ROOT)):
        results = [app.tasks[task].delay(i) for i in range(count)]
        for result in results:
            result.get(timeout=120)
        time.sleep(0.5)  # let any duplicate delivery show up
    recorded = [r for r in runs(url) if r["name"] == task]
    app.close()
    starts = sorted(r["at"] for r in recorded)
    ids = {r["id"] for r in recorded}
    # deferred: held in the worker or published again; re-queues: published again only
    deferred = [r for r in recorded if r["deferrals"]]
    requeues = sum(r.get("requeues", 0) for r in recorded)
    return {
        "lost": count - len(ids),
        "twice": len(recorded) - len(ids),
        "rate": (len(starts) - 1) / (starts[-1] - starts[0]),
        "peak": peak(starts),
        "deferred": len(deferred),
        "requeues": requeues,
    }


def throughput(url: str, noops: int, rounds: int, pool: str) -> dict[str, float]:
    """Alternating rounds of plain and FunnelTask no-ops on one worker; each FunnelTask
    round is compared with the plain round beside it, so that drift on a shared machine
    cancels out. Returns medians of tasks/s and of the paired ratios."""
    client = redis.Redis.from_url(url)
    client.flushall()
    env = {"FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url}
    app = make_app(url, url)
    names = ("proj.noop_plain", "proj.noop_funnel")
    rates: dict[str, list[float]] = {name: [] for name in names}
    options = ["-P", pool, "-Q", "proj", *(["-c", "2"] if pool in ("prefork", "threads") else [])]
    with CeleryWorkers("tests.integration.proj", 1, env, *options, cwd=str(ROOT)):
        for name in names:  # warm up both paths
            for r in [app.tasks[name].delay() for _ in range(50)]:
                r.get(timeout=60)
        for number in range(rounds):
            # alternate which goes first, so neither always follows the other
            for name in names if number % 2 == 0 else names[::-1]:
                start = time.perf_counter()
                for r in [app.tasks[name].delay() for _ in range(noops)]:
                    r.get(timeout=120)
                rates[name].append(noops / (time.perf_counter() - start))
    app.close()
    pairs = [f / p for p, f in zip(rates[names[0]], rates[names[1]], strict=True)]
    return {
        "plain": statistics.median(rates[names[0]]),
        "funnel": statistics.median(rates[names[1]]),
        "ratio": statistics.median(pairs),
        "low": min(pairs),
        "high": max(pairs),
    }


def correctness_table(url: str, tasks: int) -> str:
    """Lost, duplicated, rate and re-queues for ``tasks`` tasks through one funnel."""
    rows = {
        "FunnelTask, reservation on": accuracy(url, "proj.limited", tasks, True, None),
        "FunnelTask, reservation off": accuracy(url, "proj.limited", tasks, False, None),
        "plain task, funnel_limits": accuracy(
            url, "proj.plain", tasks, True, {"proj.plain": "10/s"}
        ),
    }
    version = redis.Redis.from_url(url).info("server")["redis_version"]
    lines = [
        f"{tasks} tasks sent at once through one 10/s funnel of capacity 1, 2 workers x"
        f" concurrency 2, Redis {version} broker and funnel; every task waited for",
        "",
        "| run | lost | run twice | admitted/s | most starts in 1 s | deferred | re-queues"
        " | re-queues per deferred |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in rows.items():
        per = f"{r['requeues'] / r['deferred']:.2f}" if r["deferred"] else "n/a"
        lines.append(
            f"| {name} | {r['lost']} | {r['twice']} | {r['rate']:.2f} | {r['peak']}"
            f" | {r['deferred']} | {r['requeues']} | {per} |"
        )
    return "\n".join(lines)


def overhead(url: str, noops: int, rounds: int) -> dict[str, dict[str, float]]:
    """``throughput`` on the prefork and threads pools."""
    return {pool: throughput(url, noops, rounds, pool) for pool in ("prefork", "threads")}


def overhead_table(results: dict[str, dict[str, float]], noops: int, rounds: int) -> str:
    """Never-limited FunnelTask against plain tasks, per pool (``overhead``)."""
    caption = (
        f"Never-limited no-ops on 1 worker (concurrency 2), {rounds} alternating rounds of"
        f" {noops} each, sent and waited for (median of paired ratios, range in brackets)"
    )
    return markdown(
        caption,
        ["pool", "plain tasks/s", "FunnelTask tasks/s", "FunnelTask / plain"],
        (
            [pool, f"{t['plain']:.0f}", f"{t['funnel']:.0f}", spread(t)]
            for pool, t in results.items()
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="celery-funnel on real workers")
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--noops", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=16)
    args = parser.parse_args()
    with RedisServer() as server:
        print(correctness_table(server.url, args.tasks))
        print()
        results = overhead(server.url, args.noops, args.rounds)
        print(overhead_table(results, args.noops, args.rounds))


if __name__ == "__main__":
    main()
