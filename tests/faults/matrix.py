"""The whole fault matrix: each case run N times, and a table of what happened.

    python3 dev.py faults [--runs N] [--load [--burners N]] [--case NAME] [--logs DIR]

Columns: the case, its runs, the tasks sent over all runs, and over all runs the tasks
lost, the extra runs of tasks run twice (or more), the worker exits of their own (or
unrecoverable errors logged), with each run's figures in brackets (lost/twice/exits).
The plain-Celery rows are the baseline: the same workload and fault on workers without
celery-funnel. Each run's worker logs, fault events and lost or twice-run task ids are
kept under ``--logs``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

from tests.faults.cases import CASES, Case
from tests.faults.rig import AMQP
from tests.faults.runner import Outcome, run_case

__all__ = ["main"]


def _rabbitmq_up() -> bool:
    where = urlsplit(AMQP)
    try:
        with socket.create_connection((where.hostname or "", where.port or 5672), timeout=1):
            return True
    except OSError:
        return False


def chosen(names: Sequence[str]) -> list[Case]:
    """The cases whose name contains any of ``names`` (every case when none is given)."""
    picked = [c for c in CASES if not names or any(n.lower() in c.name.lower() for n in names)]
    if not picked:
        sys.exit(f"no case matches {list(names)}; the cases: {[c.name for c in CASES]}")
    return picked


def row(case: Case, outcomes: list[Outcome]) -> str:
    """One table row: the sums over ``outcomes``, and each run's figures."""
    each = " ".join(f"{o.lost}/{o.twice}/{o.exits}" + ("" if o.finished else "!") for o in outcomes)
    sent, lost = sum(o.sent for o in outcomes), sum(o.lost for o in outcomes)
    twice, exits = sum(o.twice for o in outcomes), sum(o.exits for o in outcomes)
    seconds, popped = sum(o.seconds for o in outcomes), sum(o.popped_lost for o in outcomes)
    at_a_kill = sum(o.twice_at_a_kill for o in outcomes)
    return (
        f"| {case.name} | {len(outcomes)} | {sent} | {lost} | {popped} | {twice} | {at_a_kill} "
        f"| {exits} | {each} | {seconds:.0f} |"
    )


HEADER = (
    "| case | runs | tasks | lost | of which popped, never recorded (kombu) | twice "
    "| of which killed before the ack (acks_late) | exits | per run (lost/twice/exits) "
    "| seconds |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def table(results: list[tuple[Case, list[Outcome]]]) -> str:
    funnel = [row(c, o) for c, o in results if not c.baseline]
    plain = [row(c, o) for c, o in results if c.baseline]
    parts = [HEADER, *funnel]
    if plain:
        parts += ["", "plain Celery (no celery-funnel), the same workloads and faults:", "",
                  HEADER, *plain]  # fmt: skip
    return "\n".join(parts)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so that every run stops what it started


def main(argv: Sequence[str] | None = None) -> int:
    """Run the matrix and print its table; 0 when no task was lost or run twice and no
    worker exited in the celery-funnel cases and on celery_funnel.transport, else 1."""
    parser = argparse.ArgumentParser(prog="dev.py faults", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each case (default 3)")
    parser.add_argument("--load", action="store_true", help="a CPU burner per core meanwhile")
    parser.add_argument("--burners", type=int, help="with --load: this many burners instead")
    parser.add_argument("--case", action="append", default=[], help="cases whose name has this")
    parser.add_argument("--logs", type=Path, help="where to keep logs (default: a new temp dir)")
    args = parser.parse_args(argv)
    cases = chosen(args.case)
    signal.signal(signal.SIGTERM, _interrupt)
    if any(c.broker == "amqp" for c in cases) and not _rabbitmq_up():
        print(f"RabbitMQ is not listening ({AMQP}): its cases are skipped", flush=True)
        cases = [c for c in cases if c.broker != "amqp"]
    logs = args.logs or Path(tempfile.mkdtemp(prefix="celery-funnel-faults-"))
    burners = (args.burners or os.cpu_count() or 1) if args.load else 0
    print(f"logs: {logs}; CPU burners: {burners}; cores: {os.cpu_count()}", flush=True)
    began, results = time.monotonic(), []
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the table of what ran
        for number, case in enumerate(cases):
            outcomes: list[Outcome] = []
            results.append((case, outcomes))
            for run in range(1, args.runs + 1):
                where = logs / f"{number:02d}-{run}"
                outcomes.append(run_case(case, where, load=burners))
                print(f"{case.name} run {run}: {outcomes[-1]}", flush=True)
    results = [(c, o) for c, o in results if o]
    print(f"\n{table(results)}\n\n{time.monotonic() - began:.0f} s; logs: {logs}", flush=True)
    bad = any(o.lost or o.twice or o.exits for c, os_ in results if not c.baseline for o in os_)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
