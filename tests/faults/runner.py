"""Runs one case of the fault matrix on real servers and real ``celery worker``
processes, and counts what happened from the tasks' own run records.

A run: the servers start (``rig.servers``), two workers of two pool processes start
under a ``Supervisor``, the workload is sent (at once, or paced), the case's fault steps
run at their times while the supervisor restarts any worker that exits on its own. The
run ends when every task ran and the broker holds nothing that could come again
(nothing queued or un-acked, nothing parked), or when nothing is held and no task ran
for ``STALL`` seconds (the rest are lost), or at the deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celery_funnel._config.runtime import runtime_for
from tests.faults.cases import Case
from tests.faults.load import CpuLoad
from tests.faults.proj import RUNS, counts, make_fault_app, runs
from tests.faults.rig import Rig, servers
from tests.faults.workers import Supervisor
from tests.polling import wait_for

__all__ = ["Outcome", "run_case", "twice_at_a_kill"]

WORKERS_START = 120.0  # seconds the workers may take to be ready (a loaded machine)
PROBE = 0.25  # seconds between looks at the store and the broker
QUIET = 2.0  # seconds with no new run, all tasks run and nothing held: the run is over
STALL = 20.0  # seconds with no new run and nothing held, tasks missing: they are lost
BLIND = 15.0  # seconds of quiet instead, where the broker cannot tell what it holds
DEADLINE = 180.0  # seconds after the last fault step, at most


@dataclass(frozen=True)
class Outcome:
    """What one run of a case did: tasks ``sent``, ``runs`` recorded, ``lost`` (sent,
    never run), ``twice`` (runs beyond the first of a task), ``exits`` (worker processes
    that ended on their own or logged an unrecoverable error), ``kills`` (ours);
    ``popped_lost``: of the lost, those the broker's append-only file shows taken off
    the queue by kombu's Redis transport and never recorded as delivered (a broker, or
    the popping worker, killed in that instant loses the message before any Celery
    code sees it: ``tests.faults.aof``; only where the case's broker keeps the file);
    ``twice_at_a_kill``: of the extra runs, those ``acks_late`` makes (a worker killed
    after a run, before its ack: ``twice_at_a_kill()``; only where the case acks late)."""

    case: str
    sent: int
    runs: int
    lost: int
    twice: int
    exits: int
    kills: int
    seconds: float
    finished: bool  # False: the deadline came first
    logdir: str
    popped_lost: int = 0
    twice_at_a_kill: int = 0


def twice_at_a_kill(
    records: list[dict[str, Any]], kills: dict[str, list[float]], restored: dict[str, int]
) -> int:
    """Of the extra runs in ``records`` (each a run's record, of tasks that ran more than
    once), those Celery's ``acks_late`` makes: we SIGKILLed (``kills``: times by node
    name) the worker that ran the task before, between that run and this one, and the
    broker gave its message again: the run says so (``redelivered``), or, where the gate
    published the message given again for later, the broker's file does (``restored``:
    per task id, the messages it put back un-acked). The run had ended, or was cut, and
    its ack never left the killed worker."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_task.setdefault(record["id"], []).append(record)
    counted = 0
    for task_id, runs_ in by_task.items():
        runs_.sort(key=lambda r: float(r["at"]))
        again = restored.get(task_id, 0)
        for before, after in itertools.pairwise(runs_):
            node = str(before["worker"]).split("@")[0]
            if not any(before["at"] < t < after["at"] for t in kills.get(node, [])):
                continue
            if after.get("redelivered"):
                counted += 1
            elif again > 0:  # a restore the file shows, not spent on another run yet
                counted, again = counted + 1, again - 1
    return counted


class _Driver:
    """The run's clock: fault steps at their times, the supervisor, the end condition.
    Called by ``wait_for``: True once the run is over."""

    def __init__(self, rig: Rig, app: Celery) -> None:
        self.rig, self.app, self.ids = rig, app, set[str]()
        self.start = time.monotonic()
        self.pending = sorted(rig.case.steps, key=lambda step: step.at)
        self.recorded, self.changed, self.probed = 0, self.start, 0.0
        self.events, self.sent = rig.logdir / "events.txt", rig.logdir / "sent.txt"

    def note(self, text: str) -> None:
        with open(self.events, "a") as out:
            out.write(f"{time.time():.3f} {text}\n")

    def send(self, elapsed: float) -> None:
        """Send the tasks due by ``elapsed`` seconds: all at once, or ``case.pace`` a
        second (the first at 0)."""
        case = self.rig.case
        due = case.count if not case.pace else min(case.count, int(elapsed * case.pace) + 1)
        if due <= len(self.ids):
            return
        with self.app.producer_or_acquire() as producer, open(self.sent, "a") as out:
            for n in range(len(self.ids), due):
                task_id = self.app.tasks[case.task].apply_async((n,), producer=producer).id
                self.ids.add(task_id)
                out.write(f"{time.time():.3f} {n} {task_id}\n")  # to trace a lost one
        if len(self.ids) == case.count:
            self.note(f"sent {case.count} {case.task}")

    def __call__(self) -> bool:
        now = time.monotonic()
        self.send(now - self.start)
        while self.pending and self.pending[0].at <= now - self.start:
            step = self.pending.pop(0)
            self.note(step.label)
            step.act(self.rig)
        self.rig.workers.check()
        if now - self.probed < PROBE:
            return False
        self.probed = now
        with redis.Redis.from_url(self.rig.store.url) as store:
            recorded = int(store.llen(RUNS))
        if recorded != self.recorded:
            self.recorded, self.changed = recorded, now
        sent = len(self.ids) == self.rig.case.count
        return sent and not self.pending and self._over(now - self.changed)

    def _over(self, quiet: float) -> bool:
        if quiet < QUIET:
            return False
        everyone = len(counts(self.rig.store.url, self.ids)) == len(self.ids)
        if not everyone and quiet < STALL:
            return False
        held, parked = self.rig.held(), self.rig.parked()
        if held is None and self.rig.broker is None:  # RabbitMQ without rabbitmqctl
            return quiet >= (BLIND if everyone else STALL + BLIND)
        return held == 0 and parked == 0


def _close(app: Celery) -> None:
    runtime_for(app).close()  # the funnels' connections, where celery-funnel is installed
    app.close()


def run_case(case: Case, logdir: Path, *, load: int = 0) -> Outcome:
    """Run ``case`` once, with ``load`` CPU burners meanwhile; worker logs, fault events
    and the outcome go to ``logdir``."""
    logdir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    finished = True
    with servers(case, logdir) as rig, contextlib.ExitStack() as stack:
        app = make_fault_app(rig.conf(workers=False))
        stack.callback(_close, app)
        workers = Supervisor(rig.conf(workers=True).env(), rig.queue, logdir)
        rig.workers = stack.enter_context(workers)
        wait_for(workers.ready, WORKERS_START)
        if load:
            stack.enter_context(CpuLoad(load))
        driver = _Driver(rig, app)
        last = max((step.at for step in case.steps), default=0.0)
        try:
            wait_for(driver, last + DEADLINE)
        except AssertionError:  # the deadline: count what ran
            finished = False
            driver.note("deadline")
        ids = driver.ids
        tally = counts(rig.store.url, ids)
        records = [r for r in runs(rig.store.url) if tally.get(r["id"], 0) > 1]
        lost = ids - set(tally)
        parking = rig.park_states(lost) if lost and not case.celery_only else {}
        broker = rig.broker_state() if lost else {}
        twice_ids = {r["id"] for r in records}
        fate = rig.broker_fates(lost | twice_ids) if lost or twice_ids else {}
        restored = {i: fate[i].restored for i in twice_ids if i in fate}
        at_a_kill = twice_at_a_kill(records, workers.kill_times(), restored)
    outcome = Outcome(
        case=case.name, sent=len(ids), runs=sum(tally.values()), lost=len(ids) - len(tally),
        twice=sum(n - 1 for n in tally.values()), exits=workers.exits(), kills=workers.kills(),
        seconds=round(time.monotonic() - began, 1), finished=finished, logdir=str(logdir),
        popped_lost=sum(fate[i].lost_at_a_pop for i in lost if i in fate),
        twice_at_a_kill=at_a_kill if case.acks_late else 0,
    )  # fmt: skip
    detail = {
        **asdict(outcome),
        "lost_ids": sorted(lost),
        "lost_in_parking": parking,  # what the parked-task store says of each
        "broker_at_the_end": broker,
        "in_the_brokers_file": {i: asdict(f) for i, f in fate.items()},
        "twice_runs": records,
    }
    (logdir / "outcome.json").write_text(json.dumps(detail, indent=1))
    return outcome
