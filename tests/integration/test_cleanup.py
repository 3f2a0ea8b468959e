"""Nothing left running: a test run fails when a process it started outlives it, and a
run stopped by SIGTERM still stops the servers its fixtures started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from celery_funnel.testing import CeleryWorkers
from tests.leakcheck import environment, sigterm_held_back
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]


def inner_pytest(tmp_path: Path, source: str, held_back: bool = False) -> subprocess.Popen[str]:
    """A pytest run of ``source`` with the leak-check plugin, outside this suite's config;
    ``held_back``: it starts with SIGTERM blocked, as a parent's signal mask can leave it."""
    (tmp_path / "test_inner.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    with sigterm_held_back() if held_back else contextlib.nullcontext():
        return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.leakcheck", "-p",
         "no:cacheprovider", "-p", "no:celery", "test_inner.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finish(run: subprocess.Popen[str], timeout: float, stacks: Path | None = None) -> str:
    """The output of ``run`` once it ends; if it does not end within ``timeout`` seconds,
    fail with what it was doing: its signal state, threads, who holds its output pipe,
    and the stacks it writes to ``stacks`` on SIGUSR1 (faulthandler)."""
    try:
        return run.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired as timed_out:
        state = _diagnose(run)
        with contextlib.suppress(OSError):
            os.kill(run.pid, signal.SIGUSR1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.wait(2)
        run.kill()
        out = run.communicate()[0]
        if stacks is not None and stacks.exists():
            state += "\n--- stacks\n" + stacks.read_text()
        message = f"the run did not end in {timeout} s\n{state}\n--- output\n{out}"
        raise AssertionError(message) from timed_out


def _diagnose(run: subprocess.Popen[str]) -> str:
    lines = []
    proc = Path(f"/proc/{run.pid}")
    with contextlib.suppress(OSError):
        status = (proc / "status").read_text().splitlines()
        lines += [x for x in status if x.split(":")[0] in _STATUS_FIELDS]
    for task in sorted(proc.glob("task/*")):
        with contextlib.suppress(OSError):
            wchan = (task / "wchan").read_text()
            lines.append(f"thread {task.name}: {(task / 'stat').read_text().split()[2]} {wchan}")
    with contextlib.suppress(OSError):
        pipe = os.readlink(f"/proc/self/fd/{run.stdout.fileno()}") if run.stdout else ""
        for fd in Path("/proc").glob("[0-9]*/fd/*"):
            with contextlib.suppress(OSError):
                if os.readlink(fd) == pipe and int(fd.parts[2]) != os.getpid():
                    cmd = Path(f"/proc/{fd.parts[2]}/cmdline").read_bytes().replace(b"\0", b" ")
                    lines.append(f"pipe held by pid {fd.parts[2]}: {cmd[:200]!r}")
    return "\n".join(lines)


_STATUS_FIELDS = {"State", "Threads", "SigQ", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"}


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
    out = finish(run, 120)
    assert run.returncode == 1, out
    assert "1 process(es) started by the tests outlived them" in out
    pid = int(out.split("pid ", 1)[1].split(":", 1)[0])
    wait_for(lambda: not alive(pid), 10)


def test_a_process_seen_in_the_middle_of_its_exec_is_found() -> None:
    """Popen returns while the exec it started has not set the new environment up yet
    (half the reads right after it see none): a process started as a test ends is found
    all the same (a CI run passed a test leaving ``sleep 300`` behind)."""
    name, mark = "CELERY_FUNNEL_EXEC_PROBE", os.urandom(8).hex()
    for _ in range(20):
        started = subprocess.Popen(["sleep", "300"], env={name: mark})
        try:
            environ = environment(Path(f"/proc/{started.pid}"))
            assert environ.split(b"\0") == [f"{name}={mark}".encode(), b""]
        finally:
            started.kill()
            started.wait()


def test_a_clean_run_passes(tmp_path: Path) -> None:
    run = inner_pytest(tmp_path, "def test_nothing():\n    pass\n")
    out = finish(run, 120)
    assert run.returncode == 0, out


@pytest.mark.redis
@pytest.mark.parametrize("held_back", [False, True], ids=["SIGTERM", "SIGTERM blocked"])
def test_sigterm_still_stops_the_servers_fixtures_started(tmp_path: Path, held_back: bool) -> None:
    pid_file, stacks = tmp_path / "redis.pid", tmp_path / "stacks.txt"
    run = inner_pytest(
        tmp_path,
        "import faulthandler\nimport signal\nimport time\nfrom pathlib import Path\n\n"
        "import pytest\n\n"
        "from celery_funnel.testing import RedisServer\n\n"
        f"STACKS = open({str(stacks)!r}, 'w')\n"
        "faulthandler.register(signal.SIGUSR1, file=STACKS, all_threads=True)\n\n\n"
        "@pytest.fixture\ndef server():\n    with RedisServer() as server:\n"
        "        yield server\n\n\n"
        "def test_waits(server):\n"
        f"    Path({str(pid_file)!r}).write_text(str(server.process.pid))\n"
        "    time.sleep(300)\n",
        held_back,
    )
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60)  # written, not only made
    redis_pid = int(pid_file.read_text())
    assert alive(redis_pid)
    run.send_signal(signal.SIGTERM)
    out = finish(run, 60, stacks)
    assert not alive(redis_pid), out
    assert "outlived" not in out, out


# Stands in for ``python`` in ``CeleryWorkers``' command: says it is ready, counts each
# SIGTERM in a file, and ends its "warm shutdown" WARM seconds after the first, or
# never when WARM is negative (a hang).
FAKE_WORKER = """\
import os, signal, sys, time
warm, count = float(os.environ["WARM"]), os.environ["COUNT"]
print(" ready.", flush=True)
began = []
def on_term(*_):
    with open(count, "a") as out:
        out.write("TERM\\n")
    began.append(time.monotonic())
signal.signal(signal.SIGTERM, on_term)
while not began or warm < 0 or time.monotonic() - began[0] < warm:
    time.sleep(0.05)
sys.exit(0)
"""


def fake_workers(tmp_path: Path, warm: float, stop_timeout: float) -> CeleryWorkers:
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\n{FAKE_WORKER}")
    script.chmod(0o755)
    env = {"WARM": str(warm), "COUNT": str(tmp_path / "terms")}
    return CeleryWorkers("app", 2, env, python=str(script), stop_timeout=stop_timeout)


def test_workers_get_one_sigterm_each_and_end_their_warm_shutdown(tmp_path: Path) -> None:
    """A second SIGTERM is no warm shutdown: one that comes as a real worker's interpreter
    exits ends it by the signal (9 of 24 rounds of a loaded run ended -15 with two)."""
    with fake_workers(tmp_path, warm=2.0, stop_timeout=120.0) as workers:
        pass
    assert (tmp_path / "terms").read_text().splitlines() == ["TERM", "TERM"]
    assert [p.returncode for p in workers.processes] == [0, 0]


def test_a_worker_whose_warm_shutdown_hangs_is_killed_after_stop_timeout(
    tmp_path: Path,
) -> None:
    with fake_workers(tmp_path, warm=-1.0, stop_timeout=1.0) as workers:
        pass
    assert [p.returncode for p in workers.processes] == [-signal.SIGKILL, -signal.SIGKILL]
