"""The README's first command runs: real workers, one funnel, a summary at the end."""

from __future__ import annotations

import json
import os
import re
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


def test_the_cli_shows_the_demos_funnel_while_it_runs(tmp_path: object) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "celery_funnel", "demo", "--tasks", "40", "--rate", "5/s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(tmp_path),
    )  # fmt: skip
    assert demo.stdout is not None
    try:
        hint = ""
        for line in demo.stdout:  # the demo prints the command once its tasks are sent
            if "funnel status" in line:
                hint = line
                break
        assert hint, "the demo says how to watch its funnel"
        env = dict(re.findall(r"(CELERY_FUNNEL_DEMO_\w+)=(\S+)", hint))
        assert "CELERY_FUNNEL_DEMO_REDIS" in env
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "celery_funnel.demo.app", "funnel",
             "status", "--json"],
            env={**os.environ, **env},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (row,) = [r for r in json.loads(done.stdout) if r["key"] == "funnel:demo.job"]
        assert (row["rate"], row["capacity"]) == ("5/s", 5)
        assert row["reservations"] > 0, "tasks are booked while the demo runs"
    finally:
        demo.kill()
        demo.communicate(timeout=30)
