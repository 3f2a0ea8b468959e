"""A Celery project for the tests: ``make_app`` for in-process workers, and a module-level
``app`` (configured from FUNNEL_TEST_* environment variables) for ``celery -A`` workers.

Every task records each run it makes (id, time, worker, retries, headers) in the Redis
list ``runs``, so that tests can count executions and their times.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import socket
import time
import warnings
from typing import Any

import redis
from celery import Celery
from kombu.entity import Exchange, Queue

from celery_funnel import FunnelTask, install, signals
from celery_funnel._config.runtime import runtime_for
from celery_funnel._shared.publish import close_producers
from tests.broker_options import restore_options
from tests.crash import arm

RUNS = "runs"
RELEASE = "release"  # tasks run with ``hold`` end once this key exists
BACKUPS = "backups"  # ``record_backups``: the task ids of copies backed up


def new_app(
    main: str, broker_url: str, funnel_url: str, queue: str, store_url: str, **conf: Any
) -> Celery:
    """An installed app named ``main``: funnels at ``funnel_url``, results at
    ``store_url``, tasks sent to ``queue``; no task of its own yet."""
    app = Celery(main, broker=broker_url, backend=store_url.rsplit("/", 1)[0] + "/1")
    app.conf.update(
        funnel_redis_url=funnel_url,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        result_expires=600,
        **conf,
    )
    install(app)
    return app


def make_app(
    broker_url: str,
    funnel_url: str,
    queue: str = "proj",
    quorum: bool = False,
    store_url: str | None = None,
    **conf: Any,
) -> Celery:
    """An app whose funnels live at ``funnel_url``; results and run records live at
    ``store_url`` (default: the funnels' Redis), so that the funnels' Redis can fail
    alone."""
    store_url = store_url or funnel_url
    if quorum:
        # native delayed delivery needs a topic exchange
        exchange = Exchange(queue, type="topic")
        conf["task_queues"] = [
            Queue(queue, exchange, routing_key=queue, queue_arguments={"x-queue-type": "quorum"})
        ]
        conf["task_default_exchange"], conf["task_default_exchange_type"] = queue, "topic"
        conf["task_default_routing_key"] = queue
        conf["broker_transport_options"] = {"confirm_publish": True}
    app = new_app("proj", broker_url, funnel_url, queue, store_url, **conf)
    store = redis.Redis.from_url(store_url)

    def record(task: Any, *args: Any) -> None:
        request = task.request
        store.rpush(
            RUNS,
            json.dumps(
                {
                    "id": request.id,
                    "name": task.name,
                    "args": list(args),
                    "at": time.time(),
                    "worker": request.hostname or socket.gethostname(),
                    "retries": request.retries,
                    "headers": {
                        k: v for k, v in (request.headers or {}).items() if k != "celery_funnel"
                    },
                    "deferrals": (request.headers or {})
                    .get("celery_funnel", {})
                    .get("deferrals", 0),
                    "requeues": (request.headers or {}).get("celery_funnel", {}).get("requeues", 0),
                    # times its booked slot had passed when it came back (booked anew)
                    "stale": (request.headers or {}).get("celery_funnel", {}).get("stale", 0),
                }
            ),
        )

    def task(name: str, **options: Any) -> Any:
        """A task of this app only (tests make several apps with the same names)."""
        return app.task(shared=False, name=name, **options)

    def funnel_task(name: str, **options: Any) -> Any:
        return task(name, bind=True, base=FunnelTask, **{"funnel_rate": "10/s", **options})

    @funnel_task("proj.limited")
    def limited(self: Any, n: int = 0) -> int:
        record(self, n)
        return n

    @funnel_task("proj.per_customer", funnel_key="{customer}")
    def per_customer(self: Any, customer: str, n: int = 0) -> int:
        record(self, customer, n)
        return n

    @funnel_task("proj.hourly", funnel_rate="1/h")
    def hourly(self: Any, n: int = 0) -> int:
        record(self, n)
        return n

    @funnel_task("proj.adaptive", funnel_rate="20/h", funnel_adaptive={"min": "1/h"})
    def adaptive(self: Any, n: int = 0) -> int:
        record(self, n)
        return n

    @funnel_task("proj.slow", funnel_rate="1/2s")
    def slow(self: Any, n: int = 0) -> int:
        record(self, n)
        return n

    @funnel_task("proj.upstream", funnel_rate="100/s", funnel_capacity=5)
    def upstream(self: Any, n: int = 0) -> int:
        # the first run of task 0 meets a 429 with Retry-After: 1
        deferrals = (self.request.headers or {}).get("celery_funnel", {}).get("deferrals", 0)
        if n == 0 and not deferrals:
            self.funnel_backoff(1.0)
        record(self, n)
        return n

    # per customer 5/s, and 4/s over all customers: both at once
    @funnel_task(
        "proj.two_limits",
        funnel_rate="5/s",
        funnel_key="{customer}",
        funnel_limits=[{"rate": "4/s", "capacity": 1}],
    )
    def two_limits(self: Any, customer: str, n: int = 0) -> int:
        record(self, customer, n)
        return n

    # an LLM API's two named limits (docs/llm.md): requests and tokens, one funnel each
    @task("proj.llm", bind=True, base=FunnelTask, funnel_limits=[
        {"name": "requests", "rate": "10/s", "capacity": 5},
        {"name": "tokens", "rate": "300/s", "capacity": 1500, "cost": 250},
    ])  # fmt: skip
    def llm(self: Any, n: int = 0) -> int:
        record(self, n)
        return n

    # no funnel option in its code: task_annotations may give it one
    @task("proj.annotated", bind=True, base=FunnelTask)
    def annotated(self: Any, n: int = 0) -> int:
        record(self, n)
        return n

    @funnel_task("proj.costly", funnel_capacity=2, funnel_cost=lambda n: n)
    def costly(self: Any, n: int) -> int:
        record(self, n)
        return n

    @funnel_task("proj.cut_broker")
    def cut_broker(self: Any, n: int = 0) -> int:
        """Records its run, then cuts every client connection of the broker's Redis
        (its own worker's included): with acks_late, the ack after the run fails."""
        record(self, n)
        with redis.Redis.from_url(broker_url) as broker:
            broker.client_kill_filter(_type="normal", skipme=True)
        return n

    @task("proj.plain", bind=True)
    def plain(self: Any, n: int = 0) -> int:
        record(self, n)
        return n

    @task("proj.plain_retrying", bind=True)
    def plain_retrying(self: Any, n: int = 0) -> int:
        """No funnel of its own (``funnel_limits`` may give it one): its first run
        retries at once."""
        record(self, n)
        if not self.request.retries:
            raise self.retry(countdown=0)
        return n

    @task("proj.send_plain_retrying", bind=True)
    def send_plain_retrying(self: Any, count: int) -> None:
        """Sends ``count`` plain_retrying from its run: their parent (and so their
        retries') is this run."""
        for n in range(count):
            plain_retrying.delay(n)

    @task("proj.collect", bind=True)
    def collect(self: Any, values: Any) -> Any:
        record(self, values)
        return values

    # the overhead benchmark's pair: alike but for the never-limiting funnel
    @task("proj.noop_funnel", base=FunnelTask, funnel_rate="1000000/s", funnel_capacity=1000)
    def noop_funnel() -> None:
        return None

    @task("proj.noop_plain")
    def noop_plain() -> None:
        return None

    # the accuracy benchmark's pair: the same load, one shared funnel or Celery's own
    # rate_limit (per worker)
    steady_rate = os.environ.get("FUNNEL_TEST_RATE", "20/s")

    # producer back-pressure: sends refused while 10 wait to start
    @funnel_task("proj.bounded", funnel_rate="2/s", funnel_max_waiting=10, ignore_result=True)
    def bounded(self: Any, n: int = 0) -> None:
        record(self, n)

    # unique per key (no rate): a run may take `seconds`
    unique_ttl = float(os.environ.get("FUNNEL_TEST_UNIQUE_TTL", "600"))

    @task("proj.unique", bind=True, base=FunnelTask, funnel_unique=True, funnel_key="{key}",
          funnel_unique_ttl=unique_ttl)  # fmt: skip
    def unique(self: Any, key: str, n: int = 0, seconds: float = 0.0) -> int:
        record(self, key, n)
        time.sleep(seconds)
        return n

    # unique per key under a rate over all keys and one run at a time
    @task("proj.unique_limited", bind=True, base=FunnelTask, funnel_unique=True,
          funnel_key="{key}", funnel_limits=[{"rate": "2/s"}], funnel_concurrency=1)  # fmt: skip
    def unique_limited(self: Any, key: str, n: int = 0, hold: bool = False) -> int:
        record(self, key, n)
        deadline = time.monotonic() + 60
        while hold and not store.exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.02)  # the run, and so its key, lasts until the test lets go
        return n

    # unique per key; its first run retries after `countdown` seconds (the retry's
    # message keeps the key), the retry lasts until the test lets go (``RELEASE``)
    @task("proj.unique_retrying", bind=True, base=FunnelTask, funnel_unique=True,
          funnel_key="{key}", funnel_unique_ttl=unique_ttl)  # fmt: skip
    def unique_retrying(self: Any, key: str, n: int = 0, countdown: float = 3.0) -> int:
        record(self, key, n)
        if not self.request.retries:
            raise self.retry(countdown=countdown)
        deadline = time.monotonic() + 60
        while not store.exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.02)
        return n

    # unique per key (no rate): a run lasts until the test lets go (``RELEASE``), so
    # that sends made meanwhile find its key held (canvases: they follow it)
    @task("proj.unique_held", bind=True, base=FunnelTask, funnel_unique=True, funnel_key="{key}",
          funnel_unique_ttl=unique_ttl)  # fmt: skip
    def unique_held(self: Any, key: str, n: int = 0) -> int:
        record(self, key, n)
        deadline = time.monotonic() + 60
        while not store.exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.02)
        return n

    # producer back-pressure (6 wait to start at most) at 10/s; each first run fails and
    # is retried at once by ``autoretry_for`` (the retry is a send of the running task)
    @funnel_task("proj.bounded_retrying", funnel_max_waiting=6, autoretry_for=(RuntimeError,),
                 retry_kwargs={"countdown": 0, "max_retries": 3})  # fmt: skip
    def bounded_retrying(self: Any, n: int = 0) -> int:
        record(self, n)
        if not self.request.retries:
            raise RuntimeError(f"the first run of {n} fails")
        return n

    # two runs at a time (no rate); a run lasts until the test lets go (``RELEASE``)
    @task("proj.seated", bind=True, base=FunnelTask, funnel_concurrency=2)
    def seated(self: Any, n: int = 0) -> int:
        record(self, n)
        deadline = time.monotonic() + 60
        while not store.exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.02)
        return n

    if os.environ.get("FUNNEL_TEST_DEBOUNCE") == "1":  # they need AOF and parking
        debounced_tasks(task, record)

    @funnel_task("proj.steady", funnel_rate=steady_rate, ignore_result=True)
    def steady(self: Any, n: int = 0) -> None:
        record(self, n)

    @task("proj.steady_celery", bind=True, rate_limit=steady_rate, ignore_result=True)
    def steady_celery(self: Any, n: int = 0) -> None:
        record(self, n)

    # the soak's task: a funnel per customer; it only counts, so that the store stays flat
    @funnel_task("proj.soak", funnel_rate=steady_rate, funnel_key="{customer}", ignore_result=True)
    def soak(self: Any, customer: str) -> None:
        store.incr("soak:done")

    return app


def debounced_tasks(task: Any, record: Any) -> None:
    """Debounced tasks: their workers refuse to start where the funnels' Redis has no
    append-only file, or with funnel_park=False."""

    # debounced per key (no rate), and debounced under a rate and a concurrency limit
    @task("proj.debounced", bind=True, base=FunnelTask, funnel_debounce=1.0, funnel_key="{key}")
    def debounced(self: Any, key: str, n: int = 0) -> int:
        record(self, key, n)
        return n

    @task("proj.debounced_limited", bind=True, base=FunnelTask, funnel_debounce=0.5,
          funnel_debounce_max=2.0, funnel_key="{key}", funnel_rate="2/s",
          funnel_concurrency=1)  # fmt: skip
    def debounced_limited(self: Any, key: str, n: int = 0) -> int:
        record(self, key, n)
        return n

    # debounced, then one run every 3 s over all keys: a released run may be parked again
    @task("proj.debounced_slow", bind=True, base=FunnelTask, funnel_debounce=0.2,
          funnel_key="{key}", funnel_limits=[{"rate": "1/3s"}])  # fmt: skip
    def debounced_slow(self: Any, key: str, n: int = 0) -> int:
        record(self, key, n)
        return n


def close_app(app: Celery) -> None:
    """Let go of an app and every connection it holds (results, broker, funnels)."""
    with warnings.catch_warnings():
        # results hold a pub/sub consumer: let them go while servers are up (a result
        # Celery let go unclosed, of this test or an earlier one, warns as it goes)
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    consumer = getattr(app.backend, "result_consumer", None)
    if consumer is not None:
        consumer.stop()  # closes the pub/sub connection that letting them go opened
    app.backend.client.connection_pool.disconnect()  # the client does not own its pool
    close_producers(app)  # an in-process worker's gate publishes on connections of its own
    runtime_for(app).close()
    app.close()


def runs(funnel_url: str) -> list[dict[str, Any]]:
    """Every run recorded so far."""
    with redis.Redis.from_url(funnel_url) as store:
        return [json.loads(item) for item in store.lrange(RUNS, 0, -1)]


ADMITTED = "admitted"


def record_admissions(store_url: str) -> None:
    """Record each admission this worker's gate makes (task id, epoch time), from
    celery-funnel's ``task_admitted`` signal: the instant the funnel let the run through,
    before the pool's dispatch delay that a start time adds."""
    store = redis.Redis.from_url(store_url)

    def admitted(sender: str, task_id: str, **kwargs: Any) -> None:
        store.rpush(ADMITTED, json.dumps({"id": task_id, "name": sender, "at": time.time()}))

    signals.task_admitted.connect(admitted, weak=False)


def record_backups(store_url: str) -> None:
    """Record the task id of each copy this worker's gate backs up in the parked store
    (``Parking.back_up``), in the list ``BACKUPS``."""
    from celery_funnel._gate.parking import Parking

    store, back_up = redis.Redis.from_url(store_url), Parking.back_up

    def recorded(self: Parking, request: Any, *args: Any, **kwargs: Any) -> bool:
        store.rpush(BACKUPS, request.id)
        return back_up(self, request, *args, **kwargs)

    Parking.back_up = recorded  # type: ignore[method-assign]


def backups(store_url: str) -> list[str]:
    """The task ids of every backup recorded so far (``record_backups``)."""
    with redis.Redis.from_url(store_url) as store:
        return [item.decode() for item in store.lrange(BACKUPS, 0, -1)]


def admissions(store_url: str) -> list[dict[str, Any]]:
    """Every admission recorded so far (``record_admissions``)."""
    with redis.Redis.from_url(store_url) as store:
        return [json.loads(item) for item in store.lrange(ADMITTED, 0, -1)]


def skew_clock(app: Celery, seconds: float) -> None:
    """Make this process's wall clock, as Celery and kombu read it, ``seconds`` off: the
    ETA it computes when it publishes (``app.now``) and the one it compares when it
    receives (kombu's timer). The funnel never reads it: it runs on Redis's clock."""
    from kombu.asynchronous import timer

    wall, now = time.time, app.now
    timer._time = lambda: wall() + seconds  # type: ignore[attr-defined]
    app.now = lambda: now() + datetime.timedelta(seconds=seconds)


if os.environ.get("FUNNEL_TEST_BROKER"):
    limits = os.environ.get("FUNNEL_TEST_LIMITS")
    extra: dict[str, Any] = {}
    if os.environ.get("FUNNEL_TEST_VISIBILITY"):
        visibility = float(os.environ["FUNNEL_TEST_VISIBILITY"])
        extra["broker_transport_options"] = restore_options(visibility)
    if os.environ.get("FUNNEL_TEST_ACKS_LATE") == "1":
        extra["task_acks_late"] = True
    if os.environ.get("FUNNEL_TEST_PARK") == "0":
        extra["funnel_park"] = False
    if os.environ.get("FUNNEL_TEST_PARK_LEASE"):
        extra["funnel_park_lease"] = float(os.environ["FUNNEL_TEST_PARK_LEASE"])
    extra.update(json.loads(os.environ.get("FUNNEL_TEST_CONF") or "{}"))  # any more settings
    app = make_app(
        os.environ["FUNNEL_TEST_BROKER"],
        os.environ["FUNNEL_TEST_REDIS"],
        queue=os.environ.get("FUNNEL_TEST_QUEUE", "proj"),
        quorum=os.environ.get("FUNNEL_TEST_QUORUM") == "1",
        store_url=os.environ.get("FUNNEL_TEST_STORE") or None,
        funnel_limits=json.loads(limits) if limits else {},
        funnel_reservation=os.environ.get("FUNNEL_TEST_RESERVATION", "1") == "1",
        **extra,
    )
    if os.environ.get("FUNNEL_TEST_SKEW"):
        skew_clock(app, float(os.environ["FUNNEL_TEST_SKEW"]))
    if os.environ.get("FUNNEL_TEST_ADMISSIONS") == "1":
        record_admissions(os.environ.get("FUNNEL_TEST_STORE") or os.environ["FUNNEL_TEST_REDIS"])
    if os.environ.get("FUNNEL_TEST_BACKUPS") == "1":
        record_backups(os.environ.get("FUNNEL_TEST_STORE") or os.environ["FUNNEL_TEST_REDIS"])
    arm()
