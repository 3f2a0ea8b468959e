"""The README's first command runs: real workers, one funnel, a summary at the end."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_demo_runs_real_workers_through_one_funnel(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery_funnel", "demo", "--tasks", "12", "--rate", "10/s"],
        capture_output=True, text=True, timeout=180, cwd=str(tmp_path), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 of 12 tasks ran" in done.stdout
    assert "w1@" in done.stdout
    assert "w2@" in done.stdout
