"""A running two-worker cluster of ``tests.integration.proj`` and its dashboard, shared
by the live-operation tests (``test_live.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_funnel.testing import CeleryWorkers, RedisServer, free_port
from celery_funnel.testing._processes import spawn, stop
from tests.integration.proj import admissions, close_app, make_app, runs

ROOT = str(Path(__file__).resolve().parents[2])
TASK = "proj.steady"  # 20/s, capacity 1
TOKEN = "test-token-0123456789abcdef"


class Cluster:
    """A private Redis (broker and funnels), two real workers, and an app to send with."""

    def __init__(self) -> None:
        self.server = RedisServer(aof=True).start()  # paused tasks are parked (AOF)
        self.url = self.server.url
        self.env = {
            "FUNNEL_TEST_BROKER": self.url, "FUNNEL_TEST_REDIS": self.url,
            "FUNNEL_TEST_ADMISSIONS": "1",
        }  # fmt: skip
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

    def starts(self, first: int = 0, end: int | None = None) -> list[float]:
        """Start times of the runs of TASK numbered ``first`` and up, below ``end``
        (None: ``first + 10000``): each test numbers its tasks in a range of its own, so
        a test never counts another's (3000s are not 2000s)."""
        return sorted(r["at"] for r in self.runs(first, end))

    def runs(self, first: int = 0, end: int | None = None) -> list[dict[str, Any]]:
        """The runs of TASK numbered ``first`` .. ``end`` (None: ``first + 10000``)."""
        end = first + 10000 if end is None else end
        return [r for r in runs(self.url) if r["name"] == TASK and first <= r["args"][0] < end]

    def admissions(self, first: int = 0, end: int | None = None) -> list[str]:
        """The task ids the workers' gates admitted (``task_admitted``), of the runs of
        TASK numbered ``first`` .. ``end``, one per admission."""
        ids = {r["id"] for r in self.runs(first, end)}
        return [a["id"] for a in admissions(self.url) if a["id"] in ids]

    def send(self, numbers: range) -> None:
        for n in numbers:
            self.app.tasks[TASK].delay(n)

    def stop(self) -> None:
        try:
            self.workers.stop()
        finally:
            close_app(self.app)
            self.server.stop()


class Dashboard:
    """``celery -A tests.integration.proj funnel dashboard`` on a free port, with ``env``
    (the project's), and a token given by its environment variable (None: open)."""

    def __init__(self, env: Mapping[str, str], *options: str, token: str | None = TOKEN) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        env = {**os.environ, **env}
        env.pop("CELERY_FUNNEL_DASHBOARD_TOKEN", None)
        if token is not None:
            env["CELERY_FUNNEL_DASHBOARD_TOKEN"] = token
        args = [
            sys.executable, "-m", "celery", "-A", "tests.integration.proj", "funnel",
            "dashboard", "--port", str(self.port), *options,
        ]  # fmt: skip
        self.process = spawn(args, log=self._log, env=env, cwd=ROOT)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the dashboard ended: {self.log()}")
            try:
                urllib.request.urlopen(self.url + "/static/uPlot.LICENSE", timeout=2)
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the dashboard did not start: {self.log()}")

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-3000:]

    def request(
        self, path: str, method: str = "GET", body: bytes | None = None, *headers: dict[str, str]
    ) -> tuple[int, str]:
        """(status, body) of one request with ``headers`` (several dicts, merged)."""
        merged = {k: v for part in headers for k, v in part.items()}
        request = urllib.request.Request(self.url + path, body, merged, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def stop(self) -> None:
        stop(self.process)
        self._log.close()


def chromium(*arguments: str) -> Any:
    """A headless Chromium driven by selenium (Debian's chromium and chromium-driver),
    started with ``arguments`` too; skipped when missing, failed under CI. The caller
    quits it."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver):
        message = "needs Debian's chromium and chromium-driver (apt-get install -y ...)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1500,1250",
        *arguments,
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)
