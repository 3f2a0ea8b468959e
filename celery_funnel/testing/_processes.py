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
from collections.abc import Callable, Mapping, Sequence
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


def stop(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM ``process`` and wait up to ``timeout`` seconds; then SIGKILL its whole
    session (a worker's pool processes included)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # the session leader's pid is its group's
    if process.poll() is None:
        process.wait(10)
    with _lock:
        _live.discard(process)


@atexit.register
def _stop_all() -> None:
    with _lock:
        live = list(_live)
    for process in live:
        stop(process, timeout=5.0)
