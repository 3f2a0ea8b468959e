"""The README's samples run as written: the docs' "Testing your app" test
(docs/quickstart.md), against the README's quickstart ``tasks.py``, in a project folder
of their own (CI also runs the quickstart itself with the built wheel alone:
.ci/quickstart.py). The README stays a front page: at most 350 lines, its first runnable
Python within its first 60. The ``status`` samples of the README and of
docs/operations.md are real output (``CELERY_FUNNEL_WRITE_SAMPLES=1`` writes the
latter's from a run into the page)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)


def block_after(anchor: str, page: Path = README) -> str:
    """The first ```python block after ``anchor`` in ``page``."""
    found = re.search(re.escape(anchor) + r"\s*```python\n(.*?)```", page.read_text(), re.S)
    assert found is not None, f"no python block after {anchor!r} in {page.name}"
    return found.group(1)


def test_the_readme_test_of_the_quickstart_passes(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(block_after("<!-- quickstart: tasks.py -->"))
    test = block_after("A test of the quickstart's `tasks.py`:", QUICKSTART)
    (tmp_path / "test_tasks.py").write_text(test)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:celery"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_readme_status_sample_is_the_real_output(tmp_path: Path, redis_url: str) -> None:
    """The README's ``celery -A tasks funnel status`` before any task ran is what the
    command prints for its quickstart ``tasks.py`` (it lacked the ``limit`` column)."""
    import redis

    (tmp_path / "tasks.py").write_text(block_after("<!-- quickstart: tasks.py -->"))
    redis.Redis.from_url(redis_url).flushall()
    text = README.read_text()
    found = re.search(r"```\n\$ celery -A tasks funnel status\n(.*?)```", text, re.S)
    assert found is not None
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "funnel", "status"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == found.group(1)


OPERATIONS = ROOT / "docs" / "operations.md"
RUNNING = re.compile(r"(With the quickstart running \(two workers\):\n\n```\n)(.*?)(```)", re.S)


def shape(text: str) -> list[str]:
    """``text``'s lines with every number a ``N`` and every run of spaces one space."""
    return [re.sub(r"\d+(\.\d+)?", "N", " ".join(line.split())) for line in text.splitlines()]


def test_the_operations_status_sample_is_a_real_run(tmp_path: Path, redis_url: str) -> None:
    """docs/operations.md's ``funnel status`` with the quickstart running: two workers
    of the README's ``tasks.py``, 300 tasks sent at once (5/s: a minute of waits; those
    over 5 s parked on the broker's Redis). Its columns and lines are what the command
    prints while tasks wait (the page said ``booked``/``parked`` show "only when a row
    has one"). The command may take seconds on a loaded machine: a minute of waiting
    tasks leaves it time to see them."""
    import redis

    from celery_funnel.testing import CeleryWorkers
    from tests.polling import wait_for

    (tmp_path / "tasks.py").write_text(block_after("<!-- quickstart: tasks.py -->"))
    redis.Redis.from_url(redis_url).flushall()
    env = {"REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    page = OPERATIONS.read_text()
    found = RUNNING.search(page)
    assert found is not None, "the sample's block"
    sample = found.group(2)

    def status() -> str:
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tasks", "funnel", "status"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
            env={**env, "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return "$ celery -A tasks funnel status\n" + done.stdout

    seen: list[str] = []

    def alike() -> bool:
        seen.append(status())
        return shape(seen[-1]) == shape(sample)

    with CeleryWorkers("tasks", 2, env, "-c", "4", cwd=str(tmp_path)):
        send = "from tasks import call_api\nfor n in range(300): call_api.delay(n)"
        subprocess.run(
            [sys.executable, "-c", send], cwd=tmp_path, env={**os.environ, **env}, check=True,
            timeout=60,
        )  # fmt: skip
        if os.environ.get("CELERY_FUNNEL_WRITE_SAMPLES") == "1":

            def waiting() -> bool:  # tasks booked and parked, several of them
                seen.append(status())
                return "booked" in seen[-1] and bool(re.search(r"parked: \d\d? tasks", seen[-1]))

            wait_for(waiting, 50)
            sample = seen[-1]
            OPERATIONS.write_text(page[: found.start(2)] + sample + page[found.end(2) :])
        wait_for(alike, 50)
    assert "booked" in sample, sample
    assert "parked:" in sample, sample
