"""Child processes that cannot outlive the program that started them.

Each child runs in a session of its own, so that stopping it reaches everything it
started (a worker's pool processes too), and so that a terminal's Ctrl-C reaches only
the program, which then stops its children in order. On Linux a child is also told to
end when its parent dies, even by SIGKILL; and whatever is still running when the
interpreter exits is stopped then.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

__all__ = ["spawn", "stop"]

_PR_SET_PDEATHSIG = 1
_live: set[subprocess.Popen[bytes]] = set()
_lock = threading.Lock()


def _die_with_parent(sig: int) -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:  # runs in the child, between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return preexec


def spawn(
    args: Sequence[str],
    *,
    log: IO[bytes],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    death_signal: int = signal.SIGTERM,
) -> subprocess.Popen[bytes]:
    """Start ``args`` with its output in ``log``, in a new session; it receives
    ``death_signal`` if this process dies first (Linux)."""
    process = subprocess.Popen(
        list(args),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=None if env is None else dict(env),
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_die_with_parent(death_signal),  # noqa: PLW1509 - no threads fork here
    )
    with _lock:
        _live.add(process)
    return process


def _ended(pid: int) -> bool | None:
    """Whether process ``pid`` has ended but is not reaped yet (a zombie: its pid, and so
    its group's id, cannot be given to another process); None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def stop(
    process: subprocess.Popen[bytes], timeout: float = 20.0, *, terminated: bool = False
) -> None:
    """SIGTERM ``process`` (unless ``terminated``: the caller sent it) and wait up to
    ``timeout`` seconds; then SIGKILL its whole session (a worker's pool processes
    included). The leader is reaped only after its group is killed: a reaped pid may be
    reused at once (pid_max is often 32768), and killing its group then would kill
    another program's processes."""
    if process.returncode is None:
        if not terminated:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        deadline = time.monotonic() + timeout
        while _ended(process.pid) is False and time.monotonic() < deadline:
            time.sleep(0.05)
        if _ended(process.pid) is None:  # no /proc: wait the usual way (reaps it)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout)
        _kill_group(process.pid)  # the session leader's pid is its group's
    elif _members(process.pid):  # reaped before: its group lives on only in members
        _kill_group(process.pid)
    if process.poll() is None:
        process.wait(10)
    with _lock:
        _live.discard(process)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _members(pgid: int) -> bool:
    """Whether a live process is in group ``pgid`` (a group's id is not reused while it
    has members); True where /proc cannot say."""
    if not Path("/proc/self/stat").exists():
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                return True
    return False


@atexit.register
def _stop_all() -> None:
    with _lock:
        live = list(_live)
    for process in live:
        stop(process, timeout=5.0)
