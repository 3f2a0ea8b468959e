"""celery-funnel's Prometheus gauges under prefork in prometheus_client's multiprocess
mode (``PROMETHEUS_MULTIPROC_DIR``), the documented setup, on a real ``celery worker -P
prefork -c 2`` (issue 43): once its pool processes counted something (each then leaves a
0 for every gauge in its own file), ``celery_funnel_backend_up`` still reads 1 with no
outage (it read 0: the gauge took the minimum, dead processes included), and
``celery_funnel_parked`` returns to 0 once the parked tasks ran (it kept its last count).
The registry is read as an exporter reads it: a ``MultiProcessCollector`` on the
directory."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])


def read(directory: Path, name: str, **labels: str) -> float | None:
    """A sample as an exporter serving ``directory`` shows it (None: no such series)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return registry.get_sample_value(name, labels)


def test_gauges_are_true_under_prefork(
    broker: RedisServer, standalone_url: str, tmp_path: Path
) -> None:
    queue = f"prom-{time.time_ns()}"
    env = {
        "FUNNEL_TEST_BROKER": broker.url, "FUNNEL_TEST_REDIS": standalone_url,
        "FUNNEL_TEST_QUEUE": queue, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        # waits over half a second are parked (proj.slow: 1 per 2 s)
        "FUNNEL_TEST_CONF": json.dumps({"funnel_park_after": 0.5}),
    }  # fmt: skip
    app = make_app(broker.url, standalone_url, queue=queue)
    try:
        with CeleryWorkers(
            "tests.integration.metrics_proj", 1, env, "-P", "prefork", "-c", "2", "-Q", queue,
            cwd=ROOT, prefix=f"{queue}-w",
        ) as workers:  # fmt: skip
            main = workers.processes[0].pid
            # pool processes count: proj.upstream's first run of 0 backs off from the
            # pool (funnel_backoff: a deferral counted there)
            upstream = [app.tasks["proj.upstream"].delay(0) for _ in range(4)]
            assert [r.get(timeout=60) for r in upstream] == [0] * 4
            pids = {int(f.stem.rsplit("_", 1)[1]) for f in tmp_path.glob("*.db")}
            assert pids - {main}, "a pool process wrote its metrics"
            children = pids - {main}
            assert any(any(tmp_path.glob(f"gauge_*_{pid}.db")) for pid in children), (
                "a pool process left its zeros for the gauges"
            )
            assert read(tmp_path, "celery_funnel_backend_up") == 1.0
            # a pool process sees the funnels' Redis fail (its own call): the gauge is
            # the main process's, which saw no outage (a pool process that set it would
            # leave its 0 as the most recent value, for good)
            failed_in = app.send_task("metrics.pool_backend_error", queue=queue).get(timeout=60)
            assert failed_in != main, "reported in a pool process"
            errors = read(tmp_path, "celery_funnel_backend_errors_total")
            assert (errors or 0) >= 1, "the pool process counted the error"
            assert read(tmp_path, "celery_funnel_backend_up") == 1.0, "a pool's error: still 1"
            # parked: 1 per 2 s, waits from 2 to 8 s, each over funnel_park_after
            slow = [app.tasks["proj.slow"].delay(n) for n in range(5)]
            wait_for(lambda: (read(tmp_path, "celery_funnel_parked", funnel="proj.slow") or 0) >= 2)
            assert [r.get(timeout=60) for r in slow] == list(range(5))
            wait_for(lambda: read(tmp_path, "celery_funnel_parked", funnel="proj.slow") == 0.0)
            assert read(tmp_path, "celery_funnel_backend_up") == 1.0, "no outage, still 1"
            parked = read(
                tmp_path, "celery_funnel_deferred_total", funnel="proj.slow", dry_run="false",
                how="parked",
            )  # fmt: skip
            assert (parked or 0) >= 3, "deferrals, by how they waited"
    finally:
        close_app(app)
    assert len([r for r in runs(standalone_url) if r["name"] == "proj.slow"]) == 5


def test_the_waiting_gauge_counts_held_and_parked_tasks_per_queue(
    broker: RedisServer, standalone_url: str, tmp_path: Path
) -> None:
    """``celery_funnel_waiting{queue,how}`` (the autoscaling signal, issue 43): the tasks
    a funnel holds back, per queue, from the worker's main process under prefork: held in
    the worker, then parked in the funnels' Redis; back to 0 once they ran."""
    queue = f"wait-{time.time_ns()}"
    env = {
        "FUNNEL_TEST_BROKER": broker.url, "FUNNEL_TEST_REDIS": standalone_url,
        "FUNNEL_TEST_QUEUE": queue, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        # proj.slow, 1 per 2 s: 8 tasks wait 0 to 14 s; 2 and 4 s are held, longer parked
        "FUNNEL_TEST_CONF": json.dumps({"funnel_park_after": 5}),
    }  # fmt: skip
    app = make_app(broker.url, standalone_url, queue=queue)

    def waiting(how: str) -> float:
        return read(tmp_path, "celery_funnel_waiting", queue=queue, how=how) or 0.0

    try:
        with CeleryWorkers(
            "tests.integration.metrics_proj", 1, env, "-P", "prefork", "-c", "2", "-Q", queue,
            cwd=ROOT, prefix=f"{queue}-w",
        ):  # fmt: skip
            slow = [app.tasks["proj.slow"].delay(n) for n in range(8)]
            wait_for(lambda: waiting("held") >= 1, 15)
            wait_for(lambda: waiting("parked") >= 3, 20)
            assert waiting("held") + waiting("parked") <= 8
            assert [r.get(timeout=90) for r in slow] == list(range(8))
            wait_for(lambda: waiting("held") == 0 and waiting("parked") == 0, 20)
            # the series is the queue's, not another's
            assert read(tmp_path, "celery_funnel_waiting", queue="proj", how="parked") is None
    finally:
        close_app(app)
