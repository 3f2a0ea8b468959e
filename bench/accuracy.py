#!/usr/bin/env python3
"""Distributed accuracy: N real worker processes share one limit for a whole minute.

For 2 and 4 ``celery worker`` processes (prefork, concurrency 2) on a private Redis
broker, a producer offers tasks steadily at 1.5 x the limit x the workers (more than
even Celery's per-worker limit lets through) to one 20/s funnel of capacity 1, for
60 s, three ways: FunnelTask with reservation on, with it off, and a
plain task under Celery's own ``rate_limit="20/s"`` (per worker, for contrast). From
the tasks' own start records: starts per second over time (a plot), the mean rate, the
most starts in any 1 s window, tasks started twice, and re-queues per deferred task.

    python bench/accuracy.py [--seconds 60] [--workers 2 4] [--rate 20/s]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import threading
import time
from collections import Counter
from typing import Any

import redis

ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench._plot import pyplot, save
from celery_funnel import Rate
from celery_funnel.testing import CeleryWorkers, RedisServer, peak
from tests.integration.proj import close_app, make_app, runs

MODES = {
    "funnel, reservation on": ("proj.steady", "1"),
    "funnel, reservation off": ("proj.steady", "0"),
    "Celery rate_limit (per worker)": ("proj.steady_celery", "1"),
}


def produce(app: Any, task: str, per_second: float, stop: threading.Event) -> None:
    """Publish ``task`` at ``per_second`` until ``stop``, on one pooled connection."""
    with app.producer_or_acquire() as producer:
        start, n = time.monotonic(), 0
        while not stop.is_set():
            due = start + n / per_second
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
                continue
            app.tasks[task].apply_async((n,), producer=producer)
            n += 1


def one_run(mode: str, workers: int, seconds: float, rate: str) -> dict[str, Any]:
    task, reservation = MODES[mode]
    offered = Rate.parse(rate).per_second * workers * 1.5
    with RedisServer() as server:
        env = {"FUNNEL_TEST_BROKER": server.url, "FUNNEL_TEST_REDIS": server.url,
               "FUNNEL_TEST_RESERVATION": reservation, "FUNNEL_TEST_RATE": rate}  # fmt: skip
        app = make_app(server.url, server.url)
        pool = CeleryWorkers(
            "tests.integration.proj", workers, env, "-c", "2", "-Q", "proj", cwd=str(ROOT)
        )
        with pool:
            stop = threading.Event()
            producer = threading.Thread(target=produce, args=(app, task, offered, stop))
            producer.start()
            client = redis.Redis.from_url(server.url)
            while not client.llen("runs"):
                time.sleep(0.05)
            first = time.time()
            time.sleep(seconds + 0.5)
            stop.set()
            producer.join()
            for process in pool.processes:
                process.kill()  # the backlog is not drained: no warm shutdown
            recorded = runs(server.url)
            client.close()
        close_app(app)
    starts = sorted(r["at"] for r in recorded if r["at"] - first < seconds)
    deferred = [r for r in recorded if r["deferrals"]]
    ids = Counter(r["id"] for r in recorded)
    return {
        "starts": starts,
        "first": first,
        "rate": len(starts) / seconds,
        "peak": peak(starts),
        "twice": sum(n - 1 for n in ids.values()),
        # published again (the worker gate holds most waits in the worker: no re-queue)
        "requeues": (sum(r.get("requeues", 0) for r in deferred) / len(deferred))
        if deferred
        else 0.0,
        "deferred": len(deferred),
    }


def run(workers: list[int], seconds: float, rate: str) -> dict[tuple[int, str], dict[str, Any]]:
    results = {}
    for count in workers:
        for mode in MODES:
            print(f"  {count} workers, {mode} ...", flush=True, file=sys.stderr)
            results[count, mode] = one_run(mode, count, seconds, rate)
    return results


def table(results: dict[tuple[int, str], dict[str, Any]], seconds: float, rate: str) -> str:
    limit = Rate.parse(rate).per_second
    head = [
        f"One {rate} limit (capacity 1), tasks offered at 1.5 x the limit x the workers,"
        f" {seconds:g} s per run, prefork workers of concurrency 2, private Redis broker"
        " and funnel",
        "",
        f"| workers | run | starts/s (limit {limit:g}) | most in any 1 s | started twice |"
        " deferred tasks | re-queues per deferred task |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    body = [
        f"| {count} | {mode} | {r['rate']:.2f} | {r['peak']} | {r['twice']} | {r['deferred']}"
        f" | {r['requeues']:.2f} |"
        for (count, mode), r in results.items()
    ]
    return "\n".join(head + body)


def plot(
    results: dict[tuple[int, str], dict[str, Any]], seconds: float, rate: str, path: Path
) -> None:
    plt = pyplot()
    limit = Rate.parse(rate).per_second
    counts = sorted({count for count, _ in results})
    fig, axes = plt.subplots(1, len(counts), figsize=(6 * len(counts), 4), sharey=True)
    axes = axes if len(counts) > 1 else [axes]
    for ax, count in zip(axes, counts, strict=True):
        for mode in MODES:
            r = results[count, mode]
            per = Counter(int(at - r["first"]) for at in r["starts"])
            xs = list(range(int(seconds)))
            on_top = 3 if mode == "funnel, reservation on" else 2
            ax.plot(xs, [per[x] for x in xs], label=mode, linewidth=1.4, zorder=on_top)
        ax.axhline(limit, color="black", linestyle="--", linewidth=0.8, label=f"limit {rate}")
        ax.set_title(f"{count} worker processes")
        ax.set_xlabel("second of the run")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tasks started in that second")
    axes[0].legend(loc="upper left", fontsize=8)
    save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description="distributed accuracy on real workers")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rate", default="20/s")
    parser.add_argument("--plot", type=Path, help="write the plot here (PNG)")
    args = parser.parse_args()
    results = run(args.workers, args.seconds, args.rate)
    print(table(results, args.seconds, args.rate))
    if args.plot:
        plot(results, args.seconds, args.rate, args.plot)


if __name__ == "__main__":
    main()
