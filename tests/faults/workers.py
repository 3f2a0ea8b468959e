"""Real ``celery worker`` processes under a supervisor: killed and replaced on demand,
restarted when they exit on their own, and those exits counted.

Each worker slot keeps its node name (``f1@host``, ``f2@host``) across restarts, as a
supervisor restarting a worker on the same machine would; its generations share one log
file, each after a marker line, so that a generation's own lines can be told apart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from celery_funnel.testing._processes import spawn, stop

__all__ = ["Supervisor"]

ROOT = str(Path(__file__).resolve().parents[2])
UNRECOVERABLE = "Unrecoverable error"
MAX_EXITS = 30  # a worker that keeps dying on its own: the run is given up


@dataclass
class Generation:
    """One process of a worker slot: its log starts at ``offset`` of the slot's file."""

    slot: int
    number: int
    process: subprocess.Popen[bytes]
    offset: int
    started: float  # time.time()
    killed_at: float | None = None  # time.time() of our SIGKILL of its tree
    exited_alone: bool = False  # ended without our kill or stop
    end: int = -1  # where its log ends in the file (-1: still growing)

    @property
    def killed(self) -> bool:
        """Whether we killed it."""
        return self.killed_at is not None


class Supervisor:
    """``count`` workers of ``-A app`` with ``env``, ``concurrency`` pool processes each,
    consuming ``queue``; logs in ``logdir``. A context manager: on exit every worker is
    stopped (warm shutdown, then SIGKILL of its session)."""

    def __init__(
        self,
        env: dict[str, str],
        queue: str,
        logdir: Path,
        *,
        app: str = "tests.faults.proj",
        count: int = 2,
        concurrency: int = 2,
    ) -> None:
        self.env, self.queue, self.logdir, self.app = env, queue, logdir, app
        self.count, self.concurrency = count, concurrency
        self.generations: list[Generation] = []
        self.current: dict[int, Generation] = {}

    def log_path(self, slot: int) -> Path:
        return self.logdir / f"f{slot}.log"

    def _spawn(self, slot: int) -> None:
        path = self.log_path(slot)
        number = sum(1 for g in self.generations if g.slot == slot) + 1
        with open(path, "ab") as log:
            offset = log.tell()
            log.write(f"=== faults: f{slot} generation {number} at {time.time():.3f}\n".encode())
            log.flush()
            args = [
                sys.executable, "-m", "celery", "-A", self.app, "worker", "-n", f"f{slot}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
                "-c", str(self.concurrency), "-Q", self.queue,
            ]  # fmt: skip
            process = spawn(args, log=log, env={**os.environ, **self.env}, cwd=ROOT)
        generation = Generation(slot, number, process, offset, time.time())
        self.generations.append(generation)
        self.current[slot] = generation

    def start(self) -> Supervisor:
        for slot in range(1, self.count + 1):
            self._spawn(slot)
        return self

    def own_log(self, generation: Generation) -> str:
        """The lines ``generation`` wrote."""
        text = self.log_path(generation.slot).read_bytes()
        end = None if generation.end < 0 else generation.end
        return text[generation.offset : end].decode(errors="replace")

    def ready(self) -> bool:
        """Whether every current worker logged that it is ready."""
        return all(" ready." in self.own_log(g) for g in self.current.values())

    def kill(self, slot: int) -> None:
        """SIGKILL worker ``slot`` and its pool processes at once (a machine lost, not a
        shutdown), and start its replacement."""
        generation = self.current[slot]
        generation.killed_at = time.time()
        with contextlib.suppress(ProcessLookupError):  # its session: the whole tree
            os.killpg(generation.process.pid, signal.SIGKILL)
        stop(generation.process)
        self._close_log(generation)
        self._spawn(slot)

    def _close_log(self, generation: Generation) -> None:
        generation.end = self.log_path(generation.slot).stat().st_size

    def check(self, restart: bool = True) -> None:
        """Notice workers that exited on their own; start them again (a supervisor's
        job) unless ``restart`` is false."""
        for slot, generation in list(self.current.items()):
            if generation.process.poll() is None:
                continue
            generation.exited_alone = True
            stop(generation.process)  # its pool processes, if any outlived it
            self._close_log(generation)
            if restart:
                if self.exits() > MAX_EXITS:
                    raise RuntimeError(f"workers exited {MAX_EXITS} times on their own")
                self._spawn(slot)

    def exits(self) -> int:
        """Generations that ended on their own, or logged an unrecoverable error."""
        return sum(
            1 for g in self.generations if g.exited_alone or UNRECOVERABLE in self.own_log(g)
        )

    def kill_times(self) -> dict[str, list[float]]:
        """When we SIGKILLed each worker slot, by node name (``f1``): time.time()."""
        times: dict[str, list[float]] = {}
        for g in self.generations:
            if g.killed_at is not None:
                times.setdefault(f"f{g.slot}", []).append(g.killed_at)
        return times

    def kills(self) -> int:
        return sum(1 for g in self.generations if g.killed)

    def logs(self) -> str:
        return "\n".join(
            self.log_path(s).read_text(errors="replace") for s in range(1, self.count + 1)
        )

    def stop(self) -> None:
        """Warm shutdown of every current worker, then SIGKILL of what is left."""
        self.check(restart=False)
        for generation in self.current.values():
            if generation.process.poll() is None:
                generation.process.terminate()
        for generation in self.current.values():
            stop(generation.process)
            if generation.end < 0:
                self._close_log(generation)

    def __enter__(self) -> Supervisor:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
