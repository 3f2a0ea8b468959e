"""Real ``celery worker`` processes for tests: started together, stopped together."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._processes import spawn, stop

__all__ = ["CeleryWorkers"]


class CeleryWorkers:
    """``count`` real ``celery worker`` processes for ``app`` (a ``-A`` target), named
    ``w1@host`` … (``prefix`` instead of ``w``), sharing ``env``, run by ``python`` (default:
    this interpreter); stopped together: one SIGTERM each (a warm shutdown), then SIGKILL
    of a worker still running ``stop_timeout`` seconds later.

    A prefork worker's warm shutdown may take 30 s: a pool process that finished a task
    as the shutdown began waits that long for the main process, which no longer reads,
    to take its result (billiard's pool does so, lest a result be lost). A test that needs every
    warm shutdown to end on its own gives ``stop_timeout`` past that."""

    def __init__(
        self,
        app: str,
        count: int,
        env: dict[str, str],
        *options: str,
        cwd: str | None = None,
        prefix: str = "w",
        python: str | None = None,
        stop_timeout: float = 20.0,
    ) -> None:
        self.app, self.count, self.env, self.options, self.cwd = app, count, env, options, cwd
        self.prefix, self.python = prefix, python or sys.executable
        self.stop_timeout = stop_timeout
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs = tempfile.TemporaryDirectory(prefix="celery-funnel-workers-")

    def start(self) -> CeleryWorkers:
        for number in range(1, self.count + 1):
            args = [
                self.python, "-m", "celery", "-A", self.app, "worker",
                "-n", f"{self.prefix}{number}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-l", "INFO", *self.options,
            ]  # fmt: skip
            with open(Path(self._logs.name) / f"w{number}.log", "ab") as log:
                self.processes.append(
                    spawn(args, log=log, env={**os.environ, **self.env}, cwd=self.cwd)
                )
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every worker logs that it is ready."""
        deadline = time.monotonic() + timeout
        while self.logs().count(" ready.") < self.count:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"celery workers did not start:\n{self.logs()[-3000:]}")
            time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(
            path.read_text(errors="replace") for path in sorted(Path(self._logs.name).glob("*.log"))
        )

    def stop(self) -> None:
        """Warm shutdown of every worker (SIGTERM), then SIGKILL of what is left."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            # one SIGTERM each: a second one that comes as the worker's interpreter exits
            # (its handlers back to the default) ends it by the signal
            stop(process, self.stop_timeout, terminated=True)
        self._logs.cleanup()

    def __enter__(self) -> CeleryWorkers:
        try:
            self.start()
            self.wait_ready()
        except BaseException:  # the workers that did start, and their logs, go too
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
