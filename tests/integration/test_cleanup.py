"""Nothing left running: a test run fails when a process it started outlives it, and a
run stopped by SIGTERM still stops the servers its fixtures started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]


def inner_pytest(tmp_path: Path, source: str) -> subprocess.Popen[str]:
    """A pytest run of ``source`` with the leak-check plugin, outside this suite's config."""
    (tmp_path / "test_inner.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.leakcheck", "-p",
         "no:cacheprovider", "-p", "no:celery", "test_inner.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_a_process_left_running_fails_the_run(tmp_path: Path) -> None:
    run = inner_pytest(
        tmp_path,
        "import subprocess\n\n\ndef test_leaks():\n    subprocess.Popen(['sleep', '300'])\n",
    )
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 1, out
    assert "1 process(es) started by the tests outlived them" in out
    pid = int(out.split("pid ", 1)[1].split(":", 1)[0])
    wait_for(lambda: not alive(pid), 10)


def test_a_clean_run_passes(tmp_path: Path) -> None:
    run = inner_pytest(tmp_path, "def test_nothing():\n    pass\n")
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out


@pytest.mark.redis
def test_sigterm_still_stops_the_servers_fixtures_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "redis.pid"
    run = inner_pytest(
        tmp_path,
        "import time\nfrom pathlib import Path\n\nimport pytest\n\n"
        "from celery_funnel.testing import RedisServer\n\n\n"
        "@pytest.fixture\ndef server():\n    with RedisServer() as server:\n"
        "        yield server\n\n\n"
        "def test_waits(server):\n"
        f"    Path({str(pid_file)!r}).write_text(str(server.process.pid))\n"
        "    time.sleep(300)\n",
    )
    wait_for(pid_file.exists, 60)
    redis_pid = int(pid_file.read_text())
    assert alive(redis_pid)
    run.send_signal(signal.SIGTERM)
    out, _ = run.communicate(timeout=60)
    assert not alive(redis_pid), out
    assert "outlived" not in out, out
