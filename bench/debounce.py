#!/usr/bin/env python3
"""Redis memory per key of debounced and unique tasks, and the cost of one send.

N keys are sent (each twice, so that the second send replaces the first) to a task with
``funnel_debounce=3600`` (nothing is released while measuring: no worker runs), then N
keys to a task with ``funnel_unique=True``; ``INFO memory`` ``used_memory`` before and
after, divided by N. A send's time is the producer's wall time per ``delay`` (capture
of the message and one script; loopback Redis).

    python bench/debounce.py [--keys 1000 10000]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import time
from typing import Any

import redis
from celery import Celery

ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench._table import markdown
from celery_funnel import FunnelTask
from celery_funnel.testing import RedisServer
from tests.integration.proj import close_app, new_app


def app_for(broker_url: str, funnel_url: str) -> Celery:
    app = new_app("bench_debounce", broker_url, funnel_url, "bench", funnel_url,
                  task_ignore_result=True)  # fmt: skip

    @app.task(name="bench.debounced", base=FunnelTask, shared=False, funnel_debounce=3600,
              funnel_key="{record_id}")  # fmt: skip
    def debounced(record_id: str, payload: str = "") -> None:
        return None

    @app.task(name="bench.unique", base=FunnelTask, shared=False, funnel_unique=True,
              funnel_key="{record_id}")  # fmt: skip
    def unique(record_id: str, payload: str = "") -> None:
        return None

    return app


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(app: Celery, client: redis.Redis, name: str, keys: int, sends: int) -> dict[str, Any]:
    """Memory per key and µs per send of ``sends`` rounds over ``keys`` keys."""
    client.flushall()
    before = used(client)
    task = app.tasks[name]
    started = time.perf_counter()
    for n in range(sends):
        for i in range(keys):
            task.delay(f"record-{i}", payload=f"update {n}")
    elapsed = time.perf_counter() - started
    after = used(client)
    return {"bytes_per_key": (after - before) / keys, "us_per_send": elapsed / (keys * sends) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1000, 10_000])
    args = parser.parse_args()
    rows, version = [], "?"
    with RedisServer() as broker, RedisServer(aof=True) as funnels:
        app = app_for(broker.url, funnels.url)
        with redis.Redis.from_url(funnels.url) as client:
            version = str(client.info("server")["redis_version"])
            for keys in args.keys:
                for name, sends in (("bench.debounced", 2), ("bench.unique", 1)):
                    found = measure(app, client, name, keys, sends)
                    rows.append((
                        name.split(".")[1], str(keys), str(sends),
                        f"{found['bytes_per_key']:.0f}", f"{found['us_per_send']:.0f}",
                    ))  # fmt: skip
        close_app(app)
    caption = (
        f"Redis memory per key (INFO memory used_memory delta / keys), and a send's time;"
        f" redis-server {version}, loopback"
    )
    header = ["task", "keys", "sends per key", "bytes per key", "µs per send"]
    print(markdown(caption, header, rows))


if __name__ == "__main__":
    main()
