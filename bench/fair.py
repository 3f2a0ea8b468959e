#!/usr/bin/env python3
"""Fair share at scale: many tenants with one task each behind one funnel.

1. The waiting queues alone (no Celery), on a fresh private Redis: ``used_memory`` per
   waiting tenant (one task each, and ten each), and the dispatcher's pace with 10 000
   tenants waiting: the slots it books per second against the limit, passes every
   50 ms as the releaser runs them, and its cost per booked task (client side).
2. Real workers: 10 000 tenants with one task each sent to a 100/s fair funnel (two
   workers, ``-c 4``); the tasks started each second, from their own start times.

    python bench/fair.py [--tenants 10000] [--rate 100] [--seconds 300] [--skip-workers]

Writes bench/plots/fair.png and prints a table.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import json
import time

import redis

ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench._plot import pyplot, save
from celery_funnel._celery.dispatch import DISPATCH_PAUSE_SECONDS, HORIZON_SECONDS
from celery_funnel._limiter.fair import Fair
from celery_funnel._stores.fair import FairStore
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.fair_proj import RUNS, make_fair_app
from tests.integration.proj import close_app

PREFIX = "funnel:"
KEY = "funnel:{bench.fair}"
US = 1_000_000


def fill(store: FairStore, tenants: int, each: int, rate: float) -> None:
    """``tenants`` tenants with ``each`` waiting tasks."""
    t = round(US / rate)
    for n in range(tenants):
        for k in range(each):
            store.enqueue(KEY, f"task-{n}-{k}", Fair(f"tenant-{n}"), (0, False), 1, (t, t))


def memory(url: str, tenants: int, each: int) -> float:
    """Bytes of Redis memory per waiting tenant (its queue state only)."""
    client = redis.Redis.from_url(url)
    client.flushall()
    store = FairStore(client, PREFIX)
    fill(store, 1, 1, 100.0)  # scripts loaded, the funnel's keys made
    before = int(client.info("memory")["used_memory"])
    fill(store, tenants, each, 100.0)
    after = int(client.info("memory")["used_memory"])
    client.flushall()
    return (after - before) / tenants


def dispatch(url: str, tenants: int, rate: float, seconds: float) -> dict[str, float]:
    """Run the dispatcher's passes against ``tenants`` waiting tenants for ``seconds``:
    the slots booked per second (by slot time) and the cost per booked task."""
    client = redis.Redis.from_url(url)
    client.flushall()
    store = FairStore(client, PREFIX)
    fill(store, tenants, 1, rate)
    slots: list[int] = []
    spent, start = 0.0, time.monotonic()
    while time.monotonic() - start < seconds and len(slots) < tenants:
        began = time.perf_counter()
        popped = store.pop(KEY, HORIZON_SECONDS, 200, 10.0)
        spent += time.perf_counter() - began
        slots.extend(slot for _, slot in popped.slots)
        time.sleep(DISPATCH_PAUSE_SECONDS)
    first, last = slots[0], slots[-1]
    booked = (len(slots) - 1) / ((last - first) / US) if last > first else float("nan")
    return {"booked_per_s": booked, "us_per_task": spent / len(slots) * US, "tasks": len(slots)}


def workers(tenants: int, rate: float, seconds: float) -> list[float]:
    """Start times (s after sending began) of ``tenants`` one-task tenants on real workers."""
    with RedisServer() as server:
        url = server.url
        env = {
            "FUNNEL_TEST_BROKER": url,
            "FUNNEL_TEST_REDIS": url,
            "FUNNEL_FAIR_RATE": f"{rate:g}/s",
        }
        app = make_fair_app(url, url, task_ignore_result=True)
        runs = redis.Redis.from_url(url)
        with CeleryWorkers("tests.integration.fair_proj", 2, env, "-c", "4", "-Q", "fair",
                           cwd=str(ROOT)) as pool:  # fmt: skip
            pool.wait_ready()
            began = time.time()
            with app.producer_or_acquire() as producer:
                for n in range(tenants):
                    app.tasks["fair.many"].apply_async((f"tenant-{n}", n), producer=producer)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and runs.llen(RUNS) < tenants:
                time.sleep(0.5)
            starts = sorted(json.loads(r)["at"] - began for r in runs.lrange(RUNS, 0, -1))
        runs.close()
        close_app(app)
    return starts


def per_second(starts: list[float]) -> list[int]:
    return [sum(s <= t < s + 1 for t in starts) for s in range(int(max(starts, default=0)) + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--skip-workers", action="store_true")
    args = parser.parse_args()
    with RedisServer() as server:
        one = memory(server.url, args.tenants, 1)
        ten = memory(server.url, args.tenants // 10, 10)
        paced = dispatch(server.url, args.tenants, args.rate, 20.0)
        ceiling = dispatch(server.url, args.tenants, 1_000_000.0, 20.0)
    print(f"\nfair share, {args.tenants} tenants waiting (Redis used_memory, dispatcher passes)")
    print("| measure | value |")
    print("| --- | ---: |")
    print(f"| memory per waiting tenant, 1 task each (bytes) | {one:.0f} |")
    print(f"| memory per waiting tenant, 10 tasks each (bytes) | {ten:.0f} |")
    print(f"| slots booked per second at a {args.rate:g}/s limit | {paced['booked_per_s']:.2f} |")
    print(f"| dispatcher cost per booked task (client µs) | {paced['us_per_task']:.0f} |")
    print(
        f"| dispatcher cost per booked task, batches of 200 (client µs) | {ceiling['us_per_task']:.0f} |"
    )
    print(
        f"| tasks booked per second, no limit (batches of 200 every 50 ms) | {ceiling['booked_per_s']:.0f} |"
    )
    if args.skip_workers:
        return
    starts = workers(args.tenants, args.rate, args.seconds)
    rows = per_second(starts)
    print("starts per second:", rows)
    # the first task is admitted at once; the others start once released, which they
    # are behind the messages the workers have not yet taken off the broker
    rate = (len(starts) - 2) / (starts[-1] - starts[1]) if len(starts) > 2 else float("nan")
    print(f"\nreal workers: {len(starts)} of {args.tenants} one-task tenants started;"
          f" the second started {starts[1]:.1f} s after sending began (the backlog taken"
          f" off the broker), then {rate:.2f}/s ({rate / args.rate:.1%} of {args.rate:g}/s)")  # fmt: skip
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(range(len(rows)), rows, label="tasks started")
    ax.axhline(args.rate, linestyle="--", color="grey", label="limit")
    ax.set(xlabel="seconds after sending began", ylabel="starts per second")
    ax.legend()
    fig.suptitle(f"{args.tenants} tenants, one task each, one {args.rate:g}/s fair funnel")
    out = HERE / "plots" / "fair.png"
    save(fig, out)
    print(f"plot: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
