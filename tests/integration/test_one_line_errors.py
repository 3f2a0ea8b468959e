"""A mistake in the app's celery-funnel configuration is said in one line: by every
``celery funnel ...`` command (click's ``Error: ...``, nothing else on stderr; the
traceback with ``CELERY_FUNNEL_DEBUG=1``) and by a ``celery worker`` that refuses to
start (one ERROR line, exit status 1; the traceback too under ``-l DEBUG``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celery_funnel.testing import CeleryWorkers
from tests.integration.test_cli import celery_funnel
from tests.polling import wait_for

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)

BAD_LIMITS = {"FUNNEL_TEST_LIMITS": json.dumps({"proj.*": "5/x"})}  # proj's funnel_limits
SAID = (
    "Error: funnel_limits['proj.*']: rate: invalid rate '5/x': expected 'N' (per second),"
    " 'N/s', 'N/m', 'N/h', 'N/d' or 'N/<seconds>s', N like 5 or 0.5"
)
# a setting's name mistyped: two chained tracebacks, 72 lines, before
TYPO = {"FUNNEL_TEST_CONF": json.dumps({"funnel_limit": {"proj.*": "5/s"}})}
TYPO_SAID = (
    "Error: app.conf.funnel_limit={'proj.*': '5/s'} is not a celery-funnel setting"
    " (did you mean 'funnel_limits'?)"
)


@pytest.mark.parametrize(
    "args",
    [("status",), ("inspect", "proj.steady"), ("parked",), ("set", "proj.steady", "5/s"),
     ("release-lease", "proj.steady", "t1"), ("dashboard", "--port", "9")],
    ids=lambda args: args[0],
)  # fmt: skip
def test_a_misconfigured_app_is_one_line_on_the_command_line(
    redis_url: str, args: tuple[str, ...]
) -> None:
    done = celery_funnel(redis_url, *args, **BAD_LIMITS)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [SAID]
    done = celery_funnel(redis_url, *args, **TYPO)
    assert done.returncode == 1
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(TYPO_SAID)


def test_the_traceback_is_there_when_asked_for(redis_url: str) -> None:
    done = celery_funnel(redis_url, "status", **TYPO, CELERY_FUNNEL_DEBUG="1")
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.count("Traceback") == 1, "one error, not two chained"
    raised = "celery_funnel.ConfigurationError" + TYPO_SAID.removeprefix("Error")
    assert done.stderr.splitlines()[-1].startswith(raised)


MISCONFIGURED = """\
import os

from celery import Celery

from celery_funnel import FunnelTask, install

app = install(Celery("cfg_bad", broker=os.environ["CFG_BROKER"]))
app.conf.funnel_redis_url = os.environ["CFG_BROKER"]
app.conf.funnel_limit = {"cfg_bad.*": "5/s"}  # funnel_limits, mistyped


@app.task(base=FunnelTask, funnel_rate="5/s")
def send(n=0):
    return n
"""


WHY = (
    "ConfigurationError: app.conf.funnel_limit={'cfg_bad.*': '5/s'} is not a celery-funnel"
    " setting (did you mean 'funnel_limits'?)"
)


@pytest.mark.slow
@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_a_worker_refusing_to_start_says_why_in_one_line(
    tmp_path: Path, standalone_url: str, level: str
) -> None:
    (tmp_path / "cfg_bad.py").write_text(MISCONFIGURED)
    workers = CeleryWorkers(
        "cfg_bad", 1, {"CFG_BROKER": standalone_url}, "--pool", "solo", "-l", level,
        cwd=str(tmp_path),
    ).start()  # fmt: skip
    try:
        wait_for(lambda: workers.processes[0].poll() is not None, timeout=60)
        logs = workers.logs()
    finally:
        workers.stop()
    assert workers.processes[0].returncode == 1
    assert " ready." not in logs
    lines = logs.splitlines()
    logged = [line for line in lines if "ERROR/" in line or "CRITICAL/" in line]
    assert len(logged) == 1, logs  # logged once, at ERROR
    assert f"ERROR/MainProcess] {WHY}" in logged[0], logged
    if level == "DEBUG":
        assert "Traceback (most recent call last):" in logs
    else:  # the one line, and nothing else about it
        assert "Traceback" not in logs
        assert sum("ConfigurationError" in line for line in lines) == 1, logs
