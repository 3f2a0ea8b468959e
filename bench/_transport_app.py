"""The app of ``bench/transport.py``: plain Celery (no funnel) on kombu's Redis transport
or on celery-funnel's (``celery_funnel.transport:Transport``), with a no-op task that
may stamp when it ran and a task that records how long after its send it started.

A worker is configured from the environment: ``FUNNEL_BENCH_URL`` (the broker, which
also keeps the stamps), ``FUNNEL_BENCH_OURS`` ("1": celery-funnel's transport).
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

TRANSPORT = "celery_funnel.transport:Transport"
NOOP, START = "bench.transport.noop", "bench.transport.start"


def make_app(url: str, ours: bool) -> Celery:
    """A plain Celery app on broker ``url``, with celery-funnel's transport if ``ours``
    (the producer's side too: its publishes then push the wake markers)."""
    app = Celery("bench_transport", broker=url)
    app.conf.update(
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    if ours:
        app.conf.broker_transport = TRANSPORT
    return app


app = make_app(
    os.environ.get("FUNNEL_BENCH_URL", "redis://127.0.0.1:6379/0"),
    os.environ.get("FUNNEL_BENCH_OURS") == "1",
)
_stamps = redis.Redis.from_url(app.conf.broker_url)


@app.task(name=NOOP)
def noop(stamp: str = "", body: str = "") -> None:
    """Nothing; with ``stamp``, RPUSH when it ran (epoch seconds) there. ``body`` is
    the message's weight, unread."""
    if stamp:
        _stamps.rpush(stamp, repr(time.time()))


@app.task(name=START)
def start(key: str, sent: float) -> None:
    """RPUSH to ``key`` how long after ``sent`` (epoch seconds, taken just before the
    send) this run started, in seconds."""
    _stamps.rpush(key, repr(time.time() - sent))
