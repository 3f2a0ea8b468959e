"""A real Flower (PyPI ``flower``) beside a real worker (``-E``): deferred tasks as its
API and its pages show them. Deferred then run: SUCCESS, having started; revoked while
parked: REVOKED; each task received once (Flower's "Processed"), nothing left counted as
prefetched. Screenshots of its task pages are saved under the test's tmp dir (and to
$CELERY_FUNNEL_FLOWER_SCREENSHOT, e.g. docs/flower.png, when set)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from celery import Celery

from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import free_port
from celery_funnel.testing._processes import spawn, stop
from tests.integration.live_cluster import chromium
from tests.integration.proj import close_app, make_app
from tests.integration.test_celery_state import CAPPED, worker
from tests.integration.test_observability import ROOT
from tests.polling import wait_for

pytest.importorskip("flower")

pytestmark = [pytest.mark.redis, pytest.mark.slow]


class Flower:
    """``celery flower`` for the test project, its API open (no auth: local only)."""

    def __init__(self, url: str, log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ, "FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url,
            "FLOWER_UNAUTHENTICATED_API": "true",
        }  # fmt: skip
        args = [
            sys.executable, "-m", "celery", "-A", "tests.integration.proj", "flower",
            "--address=127.0.0.1", f"--port={self.port}",
        ]  # fmt: skip
        self.log = log
        with open(log, "ab") as out:
            self.process = spawn(args, log=out, env=env, cwd=ROOT)
        self.client = httpx.Client(base_url=self.base, timeout=5)

    def get(self, path: str) -> Any:
        response = self.client.get(path)
        response.raise_for_status()
        return response.json() if "json" in response.headers.get("content-type", "") else response

    def up(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"flower exited:\n{self.log.read_text()[-2000:]}")
        try:
            return self.client.get("/healthcheck").status_code == 200
        except httpx.HTTPError:
            return False

    def tasks(self) -> dict[str, dict[str, Any]]:
        return dict(self.get("/api/tasks"))

    def metric(self, name: str, **labels: str) -> float:
        """The sum of Prometheus samples ``name`` whose labels include ``labels``."""
        total = 0.0
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def close(self) -> None:
        self.client.close()
        stop(self.process)


@pytest.fixture
def app(standalone_url: str) -> Iterator[Celery]:
    app = make_app(standalone_url, standalone_url, task_ignore_result=True)
    yield app
    close_app(app)


@pytest.fixture
def flower(standalone_url: str, tmp_path: Path) -> Iterator[Flower]:
    flower = Flower(standalone_url, tmp_path / "flower.log")
    try:
        wait_for(flower.up, 30)
        yield flower
    finally:
        flower.close()


def parked(url: str) -> set[str]:
    with redis.Redis.from_url(url) as client:
        return {entry.task_id for entry in ParkStore(client, "funnel:").entries()}


def state_of(flower: Flower, task_id: str) -> str | None:
    return (flower.tasks().get(task_id) or {}).get("state")


def test_flower_shows_deferred_tasks_as_celery_would(
    app: Celery, standalone_url: str, flower: Flower, tmp_path: Path
) -> None:
    with worker(standalone_url, **CAPPED):
        # Flower hears the worker: a first task shows SUCCESS
        probe = app.tasks["proj.plain"].delay(0).id
        wait_for(lambda: state_of(flower, probe) == "SUCCESS", 30)
        ids = [app.tasks["proj.limited"].delay(n).id for n in range(20)]
        slow = [app.tasks["proj.slow"].delay(n).id for n in range(3)]
        # the third waits 4 s, parked (over the 0.5 s cap): revoked there
        wait_for(lambda: slow[2] in parked(standalone_url))
        app.control.revoke(slow[2])
        done = ids + slow[:2]
        wait_for(lambda: all(state_of(flower, i) == "SUCCESS" for i in done), 40)
        wait_for(lambda: state_of(flower, slow[2]) == "REVOKED", 20)
        tasks = flower.tasks()
        received = flower.metric("flower_events_total", type="task-received")
        prefetched = flower.metric("flower_worker_prefetched_tasks")
        deferrals = flower.metric("flower_events_total", type="funnel-deferred")
        shots = screenshots(flower, tmp_path, {"flower.png": slow[1], "revoked.png": slow[2]})
    assert all(tasks[i]["started"] and tasks[i]["succeeded"] for i in done)
    assert tasks[slow[1]]["started"] - tasks[slow[1]]["received"] > 1.5, "it waited 2 s"
    assert tasks[slow[2]]["revoked"]
    assert not tasks[slow[2]]["started"], "revoked before it ran"
    assert received == 24, "one task-received per task: 20 + 3 + the probe"
    assert prefetched == 0, "nothing left counted as prefetched"
    assert deferrals == 0, "Flower counts only task events; deferrals are no task state"
    copy_to = os.environ.get("CELERY_FUNNEL_FLOWER_SCREENSHOT")
    if copy_to:
        shutil.copyfile(shots["flower.png"][0], Path(ROOT) / copy_to)
    for name, (path, text) in shots.items():
        print(f"screenshot: {path}")
        assert ("REVOKED" if name == "revoked.png" else "SUCCESS") in text


def screenshots(flower: Flower, where: Path, pages: dict[str, str]) -> dict[str, Any]:
    """Each task page of ``pages`` (file name -> task id) in a headless Chromium: the
    png's path and the page's text."""
    from selenium.webdriver.common.by import By

    browser = chromium()
    shots: dict[str, Any] = {}
    try:
        for name, task_id in pages.items():
            browser.get(f"{flower.base}/task/{task_id}")
            page_shows: Callable[[], bool] = partial(body_shows, browser, task_id)
            wait_for(page_shows)
            path = where / name
            browser.save_screenshot(str(path))
            shots[name] = (path, browser.find_element(By.TAG_NAME, "body").text)
    finally:
        browser.quit()
    return shots


def body_shows(browser: Any, text: str) -> bool:
    """Whether the page in ``browser`` shows ``text``."""
    return text in str(browser.find_element("tag name", "body").text)
