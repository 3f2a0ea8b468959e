#!/usr/bin/env python3
"""A never-limited FunnelTask against a plain task of the same installed app, at
prefetch multipliers 1 and 4, prefork and threads (issue 44): one worker (``-c 1``)
draining no-op tasks sent at once, each recording its start with one RPUSH the same in
both (``bench/_worker_app.py``).

Throughput: the two rows take turns round by round in one run (``bench/worker.py``'s
``one_round``, a fresh worker each), and each FunnelTask round is divided by the plain
round beside it, so that a shared machine's drift falls on both alike; medians.
Instructions per task: callgrind over every process of the worker
(``bench/instructions.py``'s ``per_task``), robust to the machine's load.

    python bench/prefetch.py [--tasks 1000] [--rounds 4] [--counted 300]
        [--pools prefork,threads] [--prefetch 1,4] [--plot bench/plots/prefetch.png]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

import argparse
import os
import statistics

from bench import instructions
from bench._plot import pyplot, save
from bench._table import markdown, spread
from bench.worker import one_round
from celery_funnel.testing import RedisServer

PLAIN, FUNNEL = "installed, plain task", "FunnelTask, never limited"
TARGET = 0.95  # FunnelTask / plain throughput (issue 44)
Results = dict[str, dict[str, float]]


def throughput(url: str, pool: str, prefetch: int, count: int, rounds: int) -> dict[str, float]:
    """Median tasks/s of each row over ``rounds`` alternating rounds, and the median
    of the paired ratios FunnelTask / plain (with their range)."""
    rates: dict[str, list[float]] = {PLAIN: [], FUNNEL: []}
    for number in range(rounds):
        for row in (PLAIN, FUNNEL) if number % 2 == 0 else (FUNNEL, PLAIN):
            rates[row].append(one_round(url, row, pool, count, prefetch))
    ratios = [f / p for p, f in zip(rates[PLAIN], rates[FUNNEL], strict=True)]
    return {
        "plain": statistics.median(rates[PLAIN]),
        "funnel": statistics.median(rates[FUNNEL]),
        "ratio": statistics.median(ratios),
        "low": min(ratios),
        "high": max(ratios),
    }


def counted(url: str, pool: str, prefetch: int, tasks: int) -> dict[str, float]:
    """Instructions per task of each row (0 without valgrind, or ``tasks`` 0)."""
    if not tasks or not instructions.valgrind():
        return {"plain_i": 0.0, "funnel_i": 0.0}
    return {
        "plain_i": instructions.per_task(url, PLAIN, pool, tasks, prefetch),
        "funnel_i": instructions.per_task(url, FUNNEL, pool, tasks, prefetch),
    }


def run(
    url: str, pools: list[str], prefetches: list[int], count: int, rounds: int, tasks: int
) -> Results:
    """Per pool and prefetch multiplier: ``throughput`` and ``counted``."""
    results: Results = {}
    for pool in pools:
        for prefetch in prefetches:
            print(f"  {pool}, prefetch {prefetch} ...", flush=True, file=sys.stderr)
            results[f"{pool}, prefetch {prefetch}"] = {
                **throughput(url, pool, prefetch, count, rounds),
                **counted(url, pool, prefetch, tasks),
            }
    return results


def _instructions(r: dict[str, float]) -> list[str]:
    if not r["plain_i"]:
        return ["not counted"] * 2
    return [
        f"{r['plain_i'] / 1e6:.3f} / {r['funnel_i'] / 1e6:.3f} M",
        f"{r['funnel_i'] / r['plain_i']:.3f}",
    ]


def table(results: Results, count: int, rounds: int, tasks: int, version: str) -> str:
    caption = (
        f"One worker (-c 1) draining {count} no-op tasks sent at once, Redis {version} broker"
        f" and funnels; plain task and never-limited FunnelTask of one installed app in"
        f" {rounds} alternating rounds (median tasks/s; FunnelTask / plain: median of paired"
        f" rounds, range in brackets; target {TARGET}); instructions per task: callgrind,"
        f" every process of the worker, {tasks} tasks; funnel_allowance"
        f" {'off' if os.environ.get('FUNNEL_BENCH_ALLOWANCE') == '0' else 'on'}"
    )
    return markdown(
        caption,
        ["pool, prefetch multiplier", "plain tasks/s", "FunnelTask tasks/s",
         "FunnelTask / plain", "instructions per task, plain / FunnelTask", "FunnelTask / plain"],
        (
            [name, f"{r['plain']:.0f}", f"{r['funnel']:.0f}", spread(r), *_instructions(r)]
            for name, r in results.items()
        ),
    )  # fmt: skip


def plot(results: Results, path: Path) -> None:
    """Throughput ratio (with its range) and instructions per task, per pool and prefetch."""
    plt = pyplot()
    names = list(results)
    xs = range(len(names))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    ratios = [results[n]["ratio"] for n in names]
    low = [r - results[n]["low"] for n, r in zip(names, ratios, strict=True)]
    high = [results[n]["high"] - r for n, r in zip(names, ratios, strict=True)]
    left.bar(xs, ratios, yerr=[low, high], capsize=4, color="tab:blue")
    left.axhline(TARGET, color="black", linestyle="--", linewidth=0.8, label=f"target {TARGET}")
    left.set_ylim(0.5, 1.1)
    left.set_ylabel("FunnelTask / plain tasks/s")
    left.legend(loc="lower right", fontsize=8)
    width = 0.4
    for shift, (field, label) in zip((-width / 2, width / 2), (("plain_i", "plain"), ("funnel_i", "FunnelTask")), strict=True):  # fmt: skip
        right.bar(
            [x + shift for x in xs], [results[n][field] / 1e6 for n in names], width, label=label
        )
    right.set_ylabel("instructions per task (M, callgrind)")
    right.legend(loc="lower right", fontsize=8)
    for ax in (left, right):
        ax.set_xticks(list(xs), names, rotation=15, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description="FunnelTask against plain, prefetch 1 and 4")
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--counted", type=int, default=300, help="callgrind tasks (0: none)")
    parser.add_argument("--pools", default="prefork,threads")
    parser.add_argument("--prefetch", default="1,4")
    parser.add_argument("--plot", type=Path, help="write the plot here (PNG)")
    args = parser.parse_args()
    prefetches = [int(p) for p in args.prefetch.split(",")]
    with RedisServer() as server:
        results = run(
            server.url, args.pools.split(","), prefetches, args.tasks, args.rounds, args.counted
        )
        print(table(results, args.tasks, args.rounds, args.counted, server.version))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
