#!/usr/bin/env python3
"""Soak: 4 worker processes under steady load for 5 minutes; Redis keys and memory and
the workers' memory must stay flat.

A producer offers 120 tasks/s to per-customer funnels (2/s each) over a window of 40
customers that slides by 4 customers a second, so funnels are made all the time and
must also go away; about a third of the tasks are deferred. Every 15 s: funnel keys,
all Redis keys, Redis ``used_memory``, the broker queue, and the resident memory of
each worker with its pool processes.

    python bench/soak.py [--seconds 300] [--workers 4]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import statistics
import threading
import time
from typing import Any

import redis

ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.proj import close_app, make_app

OFFERED_PER_SECOND = 120.0
CUSTOMERS = 40
SLIDE_PER_SECOND = 4


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` and its children, KiB."""
    total = 0
    children = Path(f"/proc/{pid}/task/{pid}/children")
    pids = [pid, *(int(p) for p in children.read_text().split())] if children.exists() else [pid]
    for each in pids:
        status = Path(f"/proc/{each}/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def produce(app: Any, stop: threading.Event) -> None:
    with app.producer_or_acquire() as producer:
        start, n = time.monotonic(), 0
        while not stop.is_set():
            due = start + n / OFFERED_PER_SECOND
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
                continue
            first = int((now - start) * SLIDE_PER_SECOND)
            customer = f"c{first + n % CUSTOMERS}"
            app.tasks["proj.soak"].apply_async((customer,), producer=producer)
            n += 1


def sample(client: redis.Redis, workers: CeleryWorkers, started: float) -> dict[str, float]:
    return {
        "t": time.monotonic() - started,
        "funnel_keys": sum(1 for _ in client.scan_iter("funnel:*", count=1000)),
        "keys": client.dbsize(),
        "used_memory_kib": int(client.info("memory")["used_memory"]) / 1024,
        "queue": client.llen("proj"),
        "done": int(client.get("soak:done") or 0),
        "worker_rss_mib": sum(rss_kib(p.pid) for p in workers.processes) / 1024,
    }


def run(seconds: float, workers: int) -> list[dict[str, float]]:
    rows = []
    with RedisServer() as server:
        env = {"FUNNEL_TEST_BROKER": server.url, "FUNNEL_TEST_REDIS": server.url,
               "FUNNEL_TEST_RATE": "2/s"}  # fmt: skip
        app = make_app(server.url, server.url)
        pool = CeleryWorkers(
            "tests.integration.proj", workers, env, "-c", "2", "-Q", "proj", cwd=str(ROOT)
        )
        with pool:
            client = redis.Redis.from_url(server.url)
            stop = threading.Event()
            producer = threading.Thread(target=produce, args=(app, stop))
            producer.start()
            started = time.monotonic()
            while time.monotonic() - started < seconds:
                time.sleep(15 - (time.monotonic() - started) % 15)
                rows.append(sample(client, pool, started))
                print(format_row(rows[-1]), flush=True)
            stop.set()
            producer.join()
            client.close()
        close_app(app)
    return rows


HEADER = "| t (s) | funnel keys | Redis keys | used_memory KiB | queue | done | workers RSS MiB |"


def format_row(r: dict[str, float]) -> str:
    return (
        f"| {r['t']:.0f} | {r['funnel_keys']:.0f} | {r['keys']:.0f} | {r['used_memory_kib']:.0f}"
        f" | {r['queue']:.0f} | {r['done']:.0f} | {r['worker_rss_mib']:.1f} |"
    )


def summary(rows: list[dict[str, float]]) -> str:
    """First full minute against the last, for each figure that must stay flat."""
    first = [r for r in rows if 60 <= r["t"] < 120]
    last = rows[-4:]
    lines = [
        "| figure | minute 2 (median) | last minute (median) | change |",
        "| --- | ---: | ---: | ---: |",
    ]
    for field in ("funnel_keys", "keys", "used_memory_kib", "worker_rss_mib"):
        a = statistics.median(r[field] for r in first)
        b = statistics.median(r[field] for r in last)
        lines.append(f"| {field} | {a:.1f} | {b:.1f} | {100 * (b - a) / a:+.1f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="soak: nothing may grow")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    print(HEADER)
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = run(args.seconds, args.workers)
    rate = (rows[-1]["done"] - rows[0]["done"]) / (rows[-1]["t"] - rows[0]["t"])
    print(f"\n{rate:.1f} tasks done per second; offered {OFFERED_PER_SECOND:g}/s\n")
    print(summary(rows))


if __name__ == "__main__":
    main()
