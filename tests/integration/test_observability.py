"""What operators see: the package's signals, Celery ``funnel-deferred`` events, Prometheus
metrics, structured log lines and ``funnel_dry_run``, on real workers and a real Redis."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu.exceptions import OperationalError
from prometheus_client import CollectorRegistry

from celery_funnel import CostTooHighError
from celery_funnel.testing import CeleryWorkers
from tests.integration.conftest import Recorder, sample
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)
ROOT = str(Path(__file__).resolve().parents[2])


class Events:
    """A real Celery event receiver on the app's broker, in a thread; ``seen`` holds
    every event it got. Ready once it received a probe of its own."""

    def __init__(self, app: Celery, feed: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.app, self.feed = app, feed
        self.seen: list[dict[str, Any]] = []
        self.connection = app.connection_for_read()
        self.receiver = app.events.Receiver(self.connection, handlers={"*": self._on})
        self.thread = threading.Thread(
            target=self.receiver.capture, kwargs={"limit": None, "timeout": None}, daemon=True
        )

    def _on(self, event: dict[str, Any]) -> None:
        if self.feed is not None:  # first: a test that sees the event sees its effect
            self.feed(event)
        self.seen.append(event)

    def __enter__(self) -> Events:
        self.thread.start()
        # events travel by pub/sub: send probes until the receiver hears one
        wait_for(self._probe)
        return self

    def _probe(self) -> bool:
        """Whether a probe was heard; if not, send one, on a connection of its own: a
        connection the broker reset (a loaded RabbitMQ reset one at its first write) is
        the probe's, not the test's, and the next probe opens another."""
        if self.of("probe-ready"):
            return True
        errors = (OperationalError, *self.connection.connection_errors)
        with (
            contextlib.suppress(*errors),
            self.app.connection_for_write() as connection,
            self.app.events.Dispatcher(connection) as dispatcher,
        ):
            dispatcher.send("probe-ready")
        return False

    def __exit__(self, *exc: object) -> None:
        self.receiver.should_stop = True
        self.thread.join(10)
        self.connection.release()

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [event for event in list(self.seen) if event["type"] == type_]


@pytest.fixture
def app_for(redis_url: str, redis_client: redis.Redis) -> Iterator[Any]:
    redis_client.flushall()
    apps: list[Celery] = []

    def make(**conf: Any) -> Celery:
        conf.setdefault("task_ignore_result", True)
        apps.append(make_app(redis_url, redis_url, worker_send_task_events=True, **conf))
        return apps[-1]

    yield make
    for app in apps:
        close_app(app)


@pytest.mark.parametrize(
    ("task", "conf", "label"),
    [
        ("proj.limited", {}, "proj.limited"),
        ("proj.plain", {"funnel_limits": {"proj.plain": "10/s"}}, "limit:proj.plain"),
    ],
    ids=["FunnelTask", "funnel_limits"],
)
def test_signals_events_metrics_and_logs_report_every_deferral(
    app_for: Any,
    redis_url: str,
    recorder: Recorder,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
    task: str,
    conf: dict[str, Any],
    label: str,
) -> None:
    funnel = label
    caplog.set_level(logging.DEBUG, logger="celery_funnel")
    app = app_for(**conf)
    with (
        Events(app) as events,
        start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
    ):
        ids = {app.tasks[task].delay(i).id for i in range(5)}
        wait_for(lambda: len(runs(redis_url)) == 5)
        deferred = recorder.of("task_deferred")
        wait_for(lambda: len(events.of("funnel-deferred")) >= len(deferred))
    admitted = recorder.of("task_admitted")
    assert sorted(a["task_id"] for a in admitted) == sorted(ids), "each admitted once"
    assert deferred, "10/s, capacity 1: most of the 5 tasks wait"
    assert all(d["sender"] == task and d["funnel"] == funnel for d in deferred)
    assert all(d["task_id"] in ids and 0 < d["delay"] <= 0.5 for d in deferred)
    assert not any(d["dry_run"] for d in deferred)
    # Celery events, as Flower sees them: one per deferral
    sent = events.of("funnel-deferred")
    assert sorted(e["uuid"] for e in sent) == sorted(d["task_id"] for d in deferred)
    assert all(e["funnel"] == funnel and e["delay"] > 0 for e in sent)
    assert all(e["how"] == "held" and e["deferrals"] >= 1 for e in sent), "short waits"
    # Prometheus
    assert sample(registry, "celery_funnel_admitted_total", funnel=funnel) == 5
    deferrals = "celery_funnel_deferred_total"  # deferrals, by how they wait: all held here
    assert sample(registry, deferrals, funnel=funnel, dry_run="false", how="held") == len(deferred)
    delays = "celery_funnel_deferral_delay_seconds_count"
    assert sample(registry, delays, funnel=funnel) == len(deferred)
    # structured log lines: the same fields, in record.celery_funnel
    logged = [r.celery_funnel for r in caplog.records if hasattr(r, "celery_funnel")]
    assert sorted(r["task_id"] for r in logged if r["event"] == "deferred") == sorted(
        d["task_id"] for d in deferred
    )
    fields = {"task", "funnel", "delay", "deferrals", "booked"}
    assert all(fields <= set(r) for r in logged if r["event"] in ("deferred", "admitted"))


@pytest.mark.parametrize(
    ("task", "conf"),
    [("proj.slow", {}), ("proj.plain", {"funnel_limits": {"proj.plain": "1/2s"}})],
    ids=["FunnelTask", "funnel_limits"],
)
def test_dry_run_runs_everything_at_once_and_reports_what_it_would_defer(
    app_for: Any,
    redis_url: str,
    recorder: Recorder,
    registry: CollectorRegistry,
    task: str,
    conf: dict[str, Any],
) -> None:
    app = app_for(funnel_dry_run=True, **conf)
    with (
        Events(app) as events,
        start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
    ):
        for i in range(6):
            app.tasks[task].delay(i)
        wait_for(lambda: len(runs(redis_url)) == 6)
        starts = sorted(r["at"] for r in runs(redis_url))
    assert starts[-1] - starts[0] < 1.5, "1 task / 2 s, yet nothing waited"
    assert all(r["deferrals"] == 0 for r in runs(redis_url))
    would = recorder.of("task_deferred")
    # the first is admitted; a refused dry run takes no unit, so all others would wait
    assert len(would) == 5
    assert all(d["dry_run"] for d in would)
    assert len(recorder.of("task_admitted")) == 1
    funnel = would[0]["funnel"]
    counted = sum(
        sample(registry, "celery_funnel_deferred_total", funnel=funnel, dry_run="true", how=how)
        for how in ("held", "parked", "republished")
    )
    assert counted == 5
    assert not events.of("funnel-deferred"), "a dry run defers nothing"


def test_refused_tasks_are_reported(
    app_for: Any, redis_url: str, recorder: Recorder, registry: CollectorRegistry
) -> None:
    app = app_for(task_ignore_result=False)
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        result = app.tasks["proj.costly"].delay(3)  # capacity 2: never fits
        with pytest.raises(
            CostTooHighError, match=r"proj\.costly\[.+\] costs \[3\] units .*: it can never run"
        ):
            result.get(timeout=20)
    (refused,) = recorder.of("task_refused")
    assert refused["task_id"] == result.id
    assert type(refused["error"]).__name__ == "CostTooHighError"
    reason = {"funnel": "proj.costly", "reason": "CostTooHighError"}
    assert sample(registry, "celery_funnel_failed_total", **reason) == 1


@pytest.mark.slow
def test_worker_started_with_events_flag_sends_deferral_events_from_its_pool(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    env = {"FUNNEL_TEST_BROKER": redis_url, "FUNNEL_TEST_REDIS": redis_url}
    app = make_app(redis_url, redis_url, task_ignore_result=True)
    # prefork (the default pool), events from the command line only
    with (
        Events(app) as events,
        CeleryWorkers("tests.integration.proj", 1, env, "-c", "2", "-E", cwd=ROOT) as workers,
    ):
        workers.wait_ready()
        ids = {app.tasks["proj.limited"].delay(i).id for i in range(4)}
        wait_for(lambda: len(runs(redis_url)) == 4, timeout=30)
        deferred = {r["id"] for r in runs(redis_url) if r["deferrals"]}
        wait_for(lambda: {e["uuid"] for e in events.of("funnel-deferred")} >= deferred)
    assert deferred
    assert deferred <= ids
    close_app(app)
