"""The app of ``bench/worker.py``: no-op tasks, plain and FunnelTask, and a stamp task
that records when the first and the last task of a batch ran.

Configured from the environment: ``FUNNEL_BENCH_URL`` (broker, funnels and stamps),
``FUNNEL_BENCH_INSTALL`` ("0": celery-funnel not installed, plain Celery),
``FUNNEL_BENCH_LIMITS`` (JSON ``funnel_limits``), ``FUNNEL_BENCH_ALLOWANCE`` ("0":
``funnel_allowance`` off; on by default).
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery

from celery_funnel import FunnelTask, install

URL = os.environ.get("FUNNEL_BENCH_URL", "redis://127.0.0.1:6379/0")
NEVER = "1000000/s"  # a rate no run reaches: the funnel is consulted and always admits

INSTALL = os.environ.get("FUNNEL_BENCH_INSTALL", "1") != "0"

app = Celery("bench_worker", broker=URL)
app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False)
if INSTALL:
    app.conf.update(
        funnel_redis_url=URL,
        funnel_limits=json.loads(os.environ.get("FUNNEL_BENCH_LIMITS") or "{}"),
        funnel_allowance=os.environ.get("FUNNEL_BENCH_ALLOWANCE") != "0",
    )
    install(app)
_stamps = redis.Redis.from_url(URL)


@app.task(name="bench.plain")
def plain(stamp: str = "") -> None:
    if stamp:
        _stamps.rpush(stamp, repr(time.time()))


if INSTALL:  # a FunnelTask in an app without install(app) stops the worker, named

    @app.task(name="bench.funnel", base=FunnelTask, funnel_rate=NEVER, funnel_capacity=1000)
    def funnel(stamp: str = "") -> None:
        if stamp:
            _stamps.rpush(stamp, repr(time.time()))
