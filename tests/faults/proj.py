"""The Celery project of the fault matrix, for ``celery -A tests.faults.proj worker``.

One task per way a task is limited, each recording every run it makes (task id, name,
worker, pid, time) with one RPUSH to a record store, a Redis that no fault touches:

- ``faults.rate``: a FunnelTask, ``funnel_rate`` and ``funnel_capacity`` from the conf;
- ``faults.gated``: a plain task limited by the worker gate only (``funnel_limits``,
  the same rate and capacity);
- ``faults.slot``: a FunnelTask with ``funnel_concurrency=2`` that runs 0.5 s;
- ``faults.started``: the same, recording its start (a run killed mid-body counts twice);
- ``faults.plain``: a plain Celery task with no funnel, paced by Celery's own per-worker
  ``rate_limit`` (``plain_rate``): the plain-Celery baseline. With ``celery_only`` the
  app does not install celery-funnel at all and has only this task.

``FaultConf`` carries the settings to the workers through the environment
(``FaultConf.env()``; the module-level ``app`` reads them back when ``FAULTS_CONF`` is
set) and builds the producer's app (``make_fault_app``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from celery_funnel import FunnelTask, install
from tests.broker_options import restore_options

RUNS = "faults:runs"  # the record store's list of runs, one JSON object each
ENV = "FAULTS_CONF"
SLOT_SECONDS = 0.5  # how long a faults.slot run holds its slot


@dataclass(frozen=True)
class FaultConf:
    """Where everything lives, and how the workers are set up."""

    broker: str  # the broker URL the workers use (through the proxy where the case says)
    funnels: str  # the funnels' Redis URL the workers use (through the proxy likewise)
    store: str  # the run records' Redis: no fault touches it
    queue: str
    rate: str = "20/s"  # funnel_rate of faults.rate, and of faults.gated's limit
    capacity: int = 5
    plain_rate: str = "10/s"  # Celery's rate_limit of faults.plain, per worker
    visibility: float = 10.0  # seconds: the Redis transport's visibility_timeout
    acks_late: bool = False
    prefetch: int = 4  # worker_prefetch_multiplier
    park: str = "auto"  # funnel_park: "auto", "true" or "false"
    heartbeat: float | None = None  # broker_heartbeat (seconds), for AMQP
    celery_only: bool = False  # no celery-funnel installed: the plain-Celery baseline
    transport: str = "stock"  # "ours": broker_transport = celery_funnel.transport

    def env(self) -> dict[str, str]:
        """The environment that gives this conf to ``celery -A tests.faults.proj``."""
        return {ENV: json.dumps(dataclasses.asdict(self))}

    @classmethod
    def from_env(cls, environ: dict[str, str]) -> FaultConf:
        return cls(**json.loads(environ[ENV]))


def make_fault_app(conf: FaultConf) -> Celery:
    """The app of ``conf``: its tasks, its broker and its funnels (see the module)."""
    app = Celery("faults", broker=conf.broker)
    options: dict[str, Any] = {}
    if conf.broker.startswith("redis"):
        options["broker_transport_options"] = restore_options(conf.visibility)
    if conf.heartbeat is not None:
        options["broker_heartbeat"] = conf.heartbeat
    if conf.transport == "ours":
        options["broker_transport"] = "celery_funnel.transport:Transport"
    app.conf.update(
        task_default_queue=conf.queue,
        task_ignore_result=True,
        task_acks_late=conf.acks_late,
        worker_prefetch_multiplier=conf.prefetch,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        **options,
    )
    store = redis.Redis.from_url(conf.store)

    def record(task: Any) -> None:
        run = {
            "id": task.request.id, "name": task.name, "worker": task.request.hostname,
            "pid": os.getpid(), "at": time.time(),
            # the broker gave this message again (kombu's restore of an un-acked one)
            "redelivered": bool((task.request.delivery_info or {}).get("redelivered")),
        }  # fmt: skip
        store.rpush(RUNS, json.dumps(run))

    @app.task(shared=False, name="faults.plain", bind=True, rate_limit=conf.plain_rate)
    def plain(self: Any, n: int = 0) -> None:
        record(self)

    if not conf.celery_only:
        _funnelled_tasks(app, conf, record)
    return app


def _funnelled_tasks(app: Celery, conf: FaultConf, record: Any) -> None:
    """celery-funnel installed, and its three tasks."""
    app.conf.update(
        funnel_redis_url=conf.funnels,
        funnel_park={"true": True, "false": False}.get(conf.park, conf.park),
        funnel_limits={"faults.gated": {"rate": conf.rate, "capacity": conf.capacity}},
    )
    install(app)

    @app.task(shared=False, name="faults.rate", bind=True, base=FunnelTask,
              funnel_rate=conf.rate, funnel_capacity=conf.capacity)  # fmt: skip
    def rate(self: Any, n: int = 0) -> None:
        record(self)

    @app.task(shared=False, name="faults.gated", bind=True)
    def gated(self: Any, n: int = 0) -> None:
        record(self)

    @app.task(shared=False, name="faults.slot", bind=True, base=FunnelTask, funnel_concurrency=2)
    def slot(self: Any, n: int = 0) -> None:
        time.sleep(SLOT_SECONDS)  # the run holds its slot this long
        record(self)

    # records each start (a run killed mid-body, then run again, counts twice)
    @app.task(shared=False, name="faults.started", bind=True, base=FunnelTask,
              funnel_concurrency=2)  # fmt: skip
    def started(self: Any, n: int = 0) -> None:
        record(self)
        time.sleep(SLOT_SECONDS)


def runs(store_url: str) -> list[dict[str, Any]]:
    """Every run recorded so far."""
    with redis.Redis.from_url(store_url) as store:
        return [json.loads(item) for item in store.lrange(RUNS, 0, -1)]


def counts(store_url: str, ids: set[str]) -> Counter[str]:
    """How many times each of ``ids`` ran (ids that never ran are absent)."""
    return Counter(r["id"] for r in runs(store_url) if r["id"] in ids)


if ENV in os.environ:
    app = make_fault_app(FaultConf.from_env(dict(os.environ)))
