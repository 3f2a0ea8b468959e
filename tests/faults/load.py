"""A CPU load for the fault runs: one busy process per core, stopped at the end.

Some faults show only on a loaded machine (a worker slow to act on what it received
is more likely to be killed in between): 1 of 120 parked tasks was lost under repeated
worker kills at a load of 2-8 on 2 cores, none on a quiet machine.
"""

from __future__ import annotations

import os
import subprocess
import sys

from celery_funnel.testing._processes import spawn, stop

__all__ = ["CpuLoad"]

BURN = "while True:\n    pass\n"


class CpuLoad:
    """``processes`` busy loops (default: one per core); a context manager."""

    def __init__(self, processes: int | None = None) -> None:
        self.count = processes or os.cpu_count() or 1
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuLoad:
        try:
            with open(os.devnull, "wb") as log:
                for _ in range(self.count):
                    self.processes.append(spawn([sys.executable, "-c", BURN], log=log))
        except BaseException:  # those that did start go too
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            stop(process, timeout=5.0)
        self.processes.clear()
