#!/usr/bin/env python3
"""A parked backlog: 10 000 tasks behind a 10/s funnel on one worker, with parking on
(the default) and off. Every second: the worker's resident memory (with its pool), the
broker queue, the parked tasks and the tasks started. An idle worker is measured first.

    python bench/parked.py [--tasks 10000] [--seconds 60]

Writes bench/plots/parked.png and prints a table.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import time

import redis

ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench._plot import pyplot, save
from bench.soak import rss_kib
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.proj import RUNS, close_app, make_app

RATE = "10/s"


def samples(
    funnels: redis.Redis, broker: redis.Redis, workers: CeleryWorkers, seconds: float
) -> list[dict[str, float]]:
    """One sample a second for ``seconds``."""
    store = ParkStore(funnels, "funnel:")
    rows: list[dict[str, float]] = []
    start = time.monotonic()
    while (now := time.monotonic() - start) < seconds:
        rows.append({
            "t": now,
            "rss_mib": sum(rss_kib(p.pid) for p in workers.processes) / 1024,
            "queue": broker.llen("proj") + broker.hlen("unacked"),
            "parked": store.count(),
            "started": funnels.llen(RUNS),
        })  # fmt: skip
        time.sleep(max(0.0, len(rows) - (time.monotonic() - start)))
    return rows


def run(tasks: int, seconds: float, park: bool) -> tuple[float, list[dict[str, float]]]:
    """Idle RSS (MiB), then the samples while ``tasks`` wait behind the funnel."""
    with RedisServer() as broker_server, RedisServer(aof=True) as funnel_server:
        env = {
            "FUNNEL_TEST_BROKER": broker_server.url, "FUNNEL_TEST_REDIS": funnel_server.url,
            "FUNNEL_TEST_RATE": RATE, "FUNNEL_TEST_PARK": "1" if park else "0",
        }  # fmt: skip
        app = make_app(broker_server.url, funnel_server.url, task_ignore_result=True)
        workers = CeleryWorkers("tests.integration.proj", 1, env, "-c", "2", "-Q", "proj",
                                cwd=str(ROOT))  # fmt: skip
        funnels = redis.Redis.from_url(funnel_server.url)
        broker = redis.Redis.from_url(broker_server.url)
        with workers, funnels, broker:
            time.sleep(3)  # settled
            idle = sum(rss_kib(p.pid) for p in workers.processes) / 1024
            with app.producer_or_acquire() as producer:
                for n in range(tasks):
                    app.tasks["proj.steady"].apply_async((n,), producer=producer)
            rows = samples(funnels, broker, workers, seconds)
        close_app(app)
    return idle, rows


def summary(label: str, idle: float, rows: list[dict[str, float]]) -> str:
    tail = [r for r in rows if r["t"] >= rows[-1]["t"] - 30]
    span = tail[-1]["t"] - tail[0]["t"]
    rate = (tail[-1]["started"] - tail[0]["started"]) / span if span else float("nan")
    return (
        f"| {label} | {idle:.0f} | {max(r['rss_mib'] for r in rows):.0f} | {rows[-1]['rss_mib']:.0f} |"
        f" {max(r['queue'] for r in tail):.0f} | {rows[-1]['parked']:.0f} | {rate:.2f} |"
    )


def plot(results: dict[str, tuple[float, list[dict[str, float]]]], path: Path) -> None:
    plt = pyplot()
    fig, (memory, queue) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, (idle, rows) in results.items():
        times = [r["t"] for r in rows]
        memory.plot(times, [r["rss_mib"] - idle for r in rows], label=label)
        queue.plot(times, [r["queue"] for r in rows], label=f"{label}: broker")
        queue.plot(times, [r["parked"] for r in rows], "--", label=f"{label}: parked")
    memory.set(xlabel="seconds after sending", ylabel="worker RSS above idle (MiB)")
    queue.set(xlabel="seconds after sending", ylabel="tasks", yscale="symlog")
    memory.legend()
    queue.legend(fontsize=7)
    fig.suptitle(f"tasks waiting behind a {RATE} funnel, one worker (-c 2)")
    save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    results = {
        "parking on": run(args.tasks, args.seconds, park=True),
        "parking off": run(args.tasks, args.seconds, park=False),
    }
    print(f"\n{args.tasks} tasks behind a {RATE} funnel, {args.seconds:.0f} s after sending")
    print("| run | idle RSS MiB | peak RSS MiB | last RSS MiB | broker queue (last 30 s, max)"
          " | parked at the end | starts/s (last 30 s) |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, (idle, rows) in results.items():
        print(summary(label, idle, rows))
    out = HERE / "plots" / "parked.png"
    plot(results, out)
    print(f"plot: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
