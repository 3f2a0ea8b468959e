"""``celery-funnel demo``: several workers share one funnel on a private Redis.

Each worker is a process with its own connection that takes a unit before every job and,
when refused, waits exactly ``retry_after``. The table shows the admitted starts per
second against the limit: the workers together hold it, as one.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from ._embedded import RedisServer
from ._rate import Rate
from .backends.redis import RedisFunnel

KEY = "demo:funnel"


def _worker(url: str, rate: Rate, capacity: int, seconds: float, start: float) -> list[float]:
    funnel = RedisFunnel.from_url(url)
    starts: list[float] = []
    while time.time() < start:
        time.sleep(0.001)
    while time.time() < start + seconds:
        decision = funnel.throttle(KEY, capacity - 1, rate.count, rate.period)
        if decision.allowed:
            starts.append(time.time() - start)  # the job would run here
        else:
            time.sleep(max(decision.retry_after, 0.0))
    return starts


@contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with RedisServer() as server:
        print(f"private redis-server {server.version} on {server.url}")
        yield server.url


def run(rate_text: str, capacity: int, workers: int, seconds: float, url: str | None) -> None:
    """Run the demo and print a per-second table."""
    rate = Rate.parse(rate_text)
    with _redis(url) as redis_url:
        RedisFunnel.from_url(redis_url).reset(KEY)
        print(f"{workers} worker processes, one funnel: {rate} (capacity {capacity})\n")
        start = time.time() + 1.0  # every worker starts together
        context = multiprocessing.get_context("spawn")
        with context.Pool(workers) as pool:
            args = [(redis_url, rate, capacity, seconds, start)] * workers
            per_worker = pool.starmap(_worker, args)
    per_second = Counter(int(t) for starts in per_worker for t in starts)
    limit = rate.per_second
    print("second | admitted | limit/s | per worker")
    for second in range(int(seconds)):
        split = [sum(int(t) == second for t in starts) for starts in per_worker]
        print(f"{second:>6} | {per_second[second]:>8} | {limit:>7g} | {split}")
    total = sum(per_second.values())
    print(
        f"\n{total} admitted in {seconds:g}s: {total / seconds:.2f}/s for a limit of"
        f" {limit:g}/s plus a first burst of {capacity}"
    )
