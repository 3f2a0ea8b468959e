"""The demo's Celery app, loaded by its ``celery -A celery_funnel.demo.app worker``
processes; configured from CELERY_FUNNEL_DEMO_* environment variables."""

from __future__ import annotations

import os
import socket
import time

import redis
from celery import Celery

from .. import signals
from .._celery.task import FunnelTask
from .._install import install
from .._shared.state import State

URL = os.environ.get("CELERY_FUNNEL_DEMO_REDIS", "redis://127.0.0.1:6379/0")
STARTS = "demo:starts"
WAITS = "demo:waits"  # deferrals by how each waited: held, parked, republished

app = Celery("celery_funnel_demo", broker=URL)
app.conf.update(
    funnel_redis_url=URL,
    task_default_queue="celery-funnel-demo",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
install(app)
_store = redis.Redis.from_url(URL)


@app.task(  # type: ignore[untyped-decorator]
    base=FunnelTask,
    name="demo.job",
    ignore_result=True,
    funnel_rate=os.environ.get("CELERY_FUNNEL_DEMO_RATE", "10/s"),
    funnel_capacity=int(os.environ.get("CELERY_FUNNEL_DEMO_CAPACITY", "5")),
)
def job(n: int) -> None:
    """One unit of demo work: record when and where it started."""
    state = State.from_headers(job.request.headers)  # the gate's header, read by its owner
    deferrals = state.deferrals
    worker = job.request.hostname or socket.gethostname()
    _store.rpush(STARTS, f"{time.time()} {worker} {n} {deferrals}")


def _waited(sender: str, how: str = "held", **kwargs: object) -> None:
    """Each deferral, by how the task waits (sent by the worker's gate)."""
    _store.hincrby(WAITS, how, 1)


signals.task_deferred.connect(_waited, sender="demo.job", weak=False)
