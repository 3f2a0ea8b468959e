#!/usr/bin/env python3
"""The gate's cost per task inside one worker: tasks/s of ONE worker process draining a
pre-filled queue, plain Celery against celery-funnel's never-limited paths.

Rows (each a fresh worker, prefork -c 1 and threads -c 1):
- plain Celery: the app does not install celery-funnel (the baseline);
- installed, plain task: celery-funnel installed, the task has no funnel;
- FunnelTask, never limited: the worker gate consults its funnel for every task;
- funnel_limits, never limited: a plain task under a worker-wide limit.

A round fills the queue with N tasks (the first and the last record their start time),
then starts consuming; tasks/s = (N - 1) / (last start - first start). Rows take turns
round by round, so drift on a shared machine falls on each alike; the table gives the
median over rounds and the ratio to plain Celery of each round's neighbour.

    python bench/worker.py [--tasks 2000] [--rounds 5] [--pools prefork,threads]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

import argparse
import json
import statistics
import time
import uuid

import redis
from celery import Celery

from bench._table import markdown, spread
from celery_funnel.testing import CeleryWorkers, RedisServer

ROOT = HERE.parent
ROWS = {
    "plain Celery (not installed)": ("plain", {"FUNNEL_BENCH_INSTALL": "0"}),
    "installed, plain task": ("plain", {}),
    "FunnelTask, never limited": ("funnel", {}),
    "funnel_limits, never limited": (
        "plain", {"FUNNEL_BENCH_LIMITS": json.dumps({"bench.plain": "1000000/s"})},
    ),
}  # fmt: skip


def fill(url: str, queue: str, task: str, count: int, stamp: str) -> None:
    """``count`` messages of ``task`` in ``queue``; the first and the last stamp."""
    app = Celery("bench_filler", broker=url)
    with app.producer_or_acquire() as producer:
        for number in range(count):
            first_or_last = number in (0, count - 1)
            app.send_task(
                f"bench.{task}", kwargs={"stamp": stamp if first_or_last else ""},
                queue=queue, producer=producer,
            )  # fmt: skip
    app.close()


def one_round(url: str, row: str, pool: str, count: int, prefetch: int = 4) -> float:
    """Tasks/s of one worker process over ``count`` pre-filled tasks, its prefetch
    multiplier ``prefetch`` (Celery's default: 4)."""
    task, env = ROWS[row]
    queue, stamp = f"bench-{uuid.uuid4().hex[:8]}", f"stamp-{uuid.uuid4().hex[:8]}"
    fill(url, queue, task, count, stamp)
    client = redis.Redis.from_url(url)
    env = {"FUNNEL_BENCH_URL": url, **env}
    options = ("-P", pool, "-c", "1", "-Q", queue, "--prefetch-multiplier", str(prefetch))
    with CeleryWorkers("bench._worker_app", 1, env, *options, cwd=str(ROOT), prefix="b"):
        deadline = time.monotonic() + 600
        while client.llen(stamp) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    first, last = (float(v) for v in client.lrange(stamp, 0, 1))
    client.delete(stamp, queue)
    client.close()
    return (count - 1) / (last - first)


def run(url: str, count: int, rounds: int, pools: list[str]) -> dict[str, dict[str, float]]:
    """Per pool and row: median tasks/s and the median ratio to the plain-Celery round."""
    results: dict[str, dict[str, float]] = {}
    for pool in pools:
        rates: dict[str, list[float]] = {row: [] for row in ROWS}
        for number in range(rounds):
            order = list(ROWS) if number % 2 == 0 else list(ROWS)[::-1]
            for row in order:
                rates[row].append(one_round(url, row, pool, count))
        base = rates["plain Celery (not installed)"]
        for row, got in rates.items():
            ratios = [b / r for b, r in zip(base, got, strict=True)]  # cost per task
            results[f"{pool}: {row}"] = {
                "rate": statistics.median(got),
                "cost_us": 1e6 / statistics.median(got),
                "ratio": statistics.median(ratios),
                "low": min(ratios),
                "high": max(ratios),
            }
    return results


def table(results: dict[str, dict[str, float]], count: int, rounds: int, version: str) -> str:
    caption = (
        f"One worker process (-c 1) draining {count} pre-filled no-op tasks, Redis {version}"
        f" broker and funnels; median of {rounds} rounds; cost ratio = time per task over"
        " plain Celery's in the same round (range in brackets)"
    )
    return markdown(
        caption,
        ["pool: row", "tasks/s", "us per task", "cost / plain Celery"],
        (
            [name, f"{r['rate']:.0f}", f"{r['cost_us']:.0f}", spread(r)]
            for name, r in results.items()
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="the gate's cost per task in one worker")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pools", default="prefork,threads")
    args = parser.parse_args()
    with RedisServer() as server:
        results = run(server.url, args.tasks, args.rounds, args.pools.split(","))
        print(table(results, args.tasks, args.rounds, server.version))


if __name__ == "__main__":
    main()
