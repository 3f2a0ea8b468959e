"""Operating funnels live on a running two-worker cluster: ``celery funnel set`` changes
the admitted rate within a second, ``pause`` stops starts within a second and loses
nothing, ``resume`` and ``unset`` restore the code's limit. Rates are measured from the
tasks' own start times (``proj.steady``: 20/s in the code)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_funnel import control
from celery_funnel._park import ParkStore
from celery_funnel.testing import CeleryWorkers, RedisServer, peak
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])
TASK = "proj.steady"  # 20/s, capacity 1


class Cluster:
    """A private Redis (broker and funnels), two real workers, and an app to send with."""

    def __init__(self) -> None:
        self.server = RedisServer().start()
        self.url = self.server.url
        self.env = {"FUNNEL_TEST_BROKER": self.url, "FUNNEL_TEST_REDIS": self.url}
        self.app: Celery = make_app(self.url, self.url, task_ignore_result=True)
        self.workers = CeleryWorkers(
            "tests.integration.proj", 2, self.env, "-c", "4", "-Q", "proj", cwd=ROOT
        )

    def cli(self, *args: str) -> tuple[float, float, str]:
        """Run ``celery -A tests.integration.proj funnel ARGS``; (started, ended, output)."""
        env = {**self.env, "PATH": "/usr/bin:/bin"}
        started = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "funnel", *args],
            capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return started, time.time(), done.stdout

    def starts(self, first: int = 0) -> list[float]:
        """Start times of the runs of TASK numbered ``first`` and up."""
        return sorted(
            r["at"] for r in runs(self.url) if r["name"] == TASK and r["args"][0] >= first
        )

    def send(self, numbers: range) -> None:
        for n in numbers:
            self.app.tasks[TASK].delay(n)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    try:
        made.workers.start()
        made.workers.wait_ready()
        yield made
    finally:
        made.workers.stop()
        close_app(made.app)
        made.server.stop()


def rate(starts: list[float], begin: float, end: float) -> float:
    """Starts per second in [begin, end)."""
    return sum(begin <= at < end for at in starts) / (end - begin)


def test_set_changes_the_admitted_rate_within_a_second_and_unset_restores_it(
    cluster: Cluster, record_property: Any
) -> None:
    cluster.send(range(0, 160))
    wait_for(lambda: len(cluster.starts()) >= 30, 30)
    cluster.cli("set", TASK, "5/s")
    written = control.overrides(cluster.app)[TASK].at  # the override's own time
    time.sleep(3.5)
    _, unset_at, out = cluster.cli("unset", TASK)
    assert "back to the code's limit" in out
    wait_for(lambda: len(cluster.starts()) >= 160, 60)
    starts = cluster.starts()
    before = rate(starts, written - 1.5, written)
    under = rate(starts, written + 1.0, unset_at - 0.5)
    after = rate(starts, unset_at + 1.0, unset_at + 2.0)
    record_property("rates", {"before": before, "override": under, "after_unset": after})
    print(
        f"measured: code 20/s -> {before:.1f}/s; set 5/s -> {under:.1f}/s from 1 s after;"
        f" unset -> {after:.1f}/s from 1 s after"
    )
    assert 15 <= before <= 22
    assert 3 <= under <= 6.5, "the override's 5/s, from 1 s after it was written"
    assert after >= 14, "the code's 20/s again, 1 s after unset"
    assert len(starts) == 160, "every task ran once"
    assert peak(starts) <= 21, "never above the code's 20/s"


def test_pause_stops_starts_within_a_second_and_resume_runs_every_task_once(
    cluster: Cluster,
) -> None:
    cluster.send(range(1000, 1060))
    wait_for(lambda: len(cluster.starts(1000)) >= 10, 30)
    cluster.cli("pause", TASK)
    written = control.overrides(cluster.app)[TASK].at
    store = ParkStore(redis.Redis.from_url(cluster.url), "funnel:")
    wait_for(lambda: store.counts().get(TASK, 0) > 0, 10)  # waiting tasks park
    time.sleep(2.0)
    paused_starts = cluster.starts(1000)
    resumed, _, _ = cluster.cli("resume", TASK)
    wait_for(lambda: len(cluster.starts(1000)) >= 60, 60)
    starts = cluster.starts(1000)
    late = [at for at in paused_starts if at > written + 1.0]
    first = min(at for at in starts if at > resumed)
    print(
        f"measured: last start {max(paused_starts) - written:.3f} s after the pause was"
        f" written; first start {first - resumed:.3f} s after `resume` was run"
    )
    assert late == [], "no start later than 1 s after the pause"
    assert len(starts) == 60, "nothing lost, nothing run twice"
    recorded = sorted(r["args"][0] for r in runs(cluster.url) if r["args"][0] >= 1000)
    assert recorded == list(range(1000, 1060))
    assert 0 < rate(starts, resumed, max(starts) + 1e-3) <= 21
