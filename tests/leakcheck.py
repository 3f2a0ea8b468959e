"""A pytest plugin: the run fails if a process it started outlives it.

Every process the tests start inherits ``CELERY_FUNNEL_TEST_RUN`` (a fresh id per run) in
its environment; at the end of the run, any live process that carries this run's id
(a redis-server, a worker or one of its pool processes) is reported, killed, and fails
the run. SIGTERM ends the run like Ctrl-C, so that fixtures still stop what they started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

MARK = "CELERY_FUNNEL_TEST_RUN"
GRACE_SECONDS = 10.0
EXEC_SECONDS = 2.0  # the longest a process is read again while its exec shows no environment
PF_KTHREAD = 0x00200000  # /proc/<pid>/stat's flags: a kernel thread (it has no environment)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    os.environ[MARK] = uuid.uuid4().hex
    signal.signal(signal.SIGTERM, _interrupt)
    # a mask inherited from whatever started the run would hold SIGTERM back for good
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


@contextlib.contextmanager
def sigterm_held_back() -> Iterator[None]:
    """Processes started inside start with SIGTERM blocked, as the signal mask of the
    program that starts them can leave them (a blocked signal stays pending for good)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def marked_processes(mark: str, name: str = MARK) -> dict[int, str]:
    """pid -> command line of every live process whose environment has ``name=mark``."""
    needle = f"{name}={mark}".encode()
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in environment(entry).split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                found[pid] = command.decode(errors="replace").strip()
    # multiprocessing's resource tracker is the standard library's, and ends with its parent
    return {pid: c for pid, c in found.items() if "multiprocessing.resource_tracker" not in c}


def environment(entry: Path) -> bytes:
    """The environment of process ``entry`` (a /proc directory). A process in the middle of
    an exec shows none for a moment, and its starter may already have gone on (Popen
    returns once the exec closed its close-on-exec pipe, before the new environment is
    set up: about half the reads right after it, on a 2-core machine): it is read again
    until it shows one, or ``EXEC_SECONDS`` pass."""
    deadline = time.monotonic() + EXEC_SECONDS
    while not (environ := (entry / "environ").read_bytes()) and time.monotonic() < deadline:
        fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X") or int(fields[6]) & PF_KTHREAD:
            break  # an ended process or a kernel thread: it has none
        time.sleep(0.01)
    return environ


def _survivors(mark: str) -> dict[int, str]:
    deadline = time.monotonic() + GRACE_SECONDS
    while (left := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)  # processes told to stop may still be finishing
    return left


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not Path("/proc/self/environ").exists():
        return
    left = _survivors(os.environ[MARK])
    if not left:
        return
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    lines = "\n".join(f"  pid {pid}: {command[:200]}" for pid, command in sorted(left.items()))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"{len(left)} process(es) started by the tests outlived them (killed now):\n{lines}"
    if reporter is not None:
        reporter.write_line(message, red=True)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
