"""The cases of the fault matrix: each a workload and a timed fault.

Every workload but two is sent at once, before the first fault (a backlog, so that no
fault meets the producer); the funnels then let it through at their rate, and the plain-Celery
baseline's tasks are paced by Celery's own per-worker ``rate_limit`` (two workers at
half the funnel's rate), so that both run as long and meet the same faults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tests.faults.rig import Rig

__all__ = ["CASES", "CI_CASES", "Case", "Step"]


@dataclass(frozen=True)
class Step:
    """``act`` on the rig ``at`` seconds after the workload was sent."""

    at: float
    label: str
    act: Callable[[Rig], None]


def partition(at: float = 3.0, length: float = 10.0) -> tuple[Step, ...]:
    """The proxy cuts the network for ``length`` seconds, ``at`` seconds in."""
    return (
        Step(at, "network cut", lambda rig: rig.require_proxy().cut()),
        Step(at + length, "network healed", lambda rig: rig.require_proxy().heal()),
    )


def kill_loop(start: float = 3.0, every: float = 3.0, times: int = 6) -> tuple[Step, ...]:
    """A worker SIGKILLed (its whole tree) and replaced every ``every`` seconds, the two
    workers in turn."""

    def kill(slot: int) -> Callable[[Rig], None]:
        return lambda rig: rig.workers.kill(slot)

    return tuple(
        Step(start + k * every, f"SIGKILL worker f{k % 2 + 1}", kill(k % 2 + 1))
        for k in range(times)
    )


def restarts(
    server: Literal["broker", "funnels"], at: tuple[float, ...], down: float = 1.5
) -> tuple[Step, ...]:
    """The ``server``'s Redis SIGKILLed at each of ``at`` and started again (same port,
    same files) ``down`` seconds later."""
    steps: list[Step] = []
    for when in at:
        steps.append(Step(when, f"SIGKILL {server} Redis", lambda rig: rig.redis(server).kill()))
        steps.append(Step(when + down, f"start {server} Redis", lambda rig: rig.start(server)))
    return tuple(steps)


@dataclass(frozen=True)
class Case:
    """A workload (``count`` tasks ``task``) and its fault (``steps``), and the setup."""

    name: str
    task: str
    count: int
    steps: tuple[Step, ...]
    rate: str = "20/s"  # the funnel's rate (faults.rate, faults.gated)
    capacity: int = 5
    broker: Literal["redis", "redis-aof", "amqp"] = "redis"
    proxied: Literal["none", "funnels", "broker"] = "none"  # what the proxy stands before
    funnels_aof: bool = False  # appendonly yes, appendfsync always: parking is on
    acks_late: bool = False
    prefetch: int = 4
    visibility: float = 10.0
    pace: float = 0.0  # tasks sent a second (0: all at once, before the first fault)
    ci: bool = True  # in tests/integration/test_fault_matrix.py
    # the broker transport: kombu's own, or celery_funnel.transport's (a Redis broker)
    transport: Literal["stock", "ours"] = "stock"

    @property
    def celery_only(self) -> bool:
        """The plain-Celery baseline: workers without celery-funnel."""
        return self.task == "faults.plain"

    @property
    def baseline(self) -> bool:
        """A row the matrix shows but does not hold to 0 lost, 0 twice: plain Celery on
        kombu's own transport (Celery's own figures)."""
        return self.celery_only and self.transport == "stock"

    def on_the_transport(self, *, ci: bool = False) -> Case:
        """This case on ``celery_funnel.transport`` (its name says so)."""
        return dataclasses.replace(self, name=f"{self.name}, transport", transport="ours", ci=ci)

    @property
    def plain_rate(self) -> str:
        """Celery's per-worker rate_limit that paces the baseline like the funnel."""
        count, per = self.rate.split("/")
        return f"{float(count) / 2:g}/{per}"


def _partitioned(name: str, task: str, count: int = 200, *, aof: bool = False) -> Case:
    return Case(name, task, count, partition(), proxied="funnels", funnels_aof=aof)


def _killed(
    name: str, task: str, *, aof: bool = False, ci: bool = True, paced: bool = True,
    at_a_send: bool = False,
) -> Case:  # fmt: skip
    """120 instant tasks through 4/s, capacity 1; acks_late, prefetch 4; sent at 4/s
    (``paced``) or at once. Each kill comes half-way between two of the funnel's slots
    (at 4/s a send, and a parked task's release, comes every 0.25 s from the first
    send), unless ``at_a_send``: then in the same instant as a send or a release (3 s
    is a whole number of slots). A worker killed just after Redis handed it a message
    (BRPOP) loses that message, for plain Celery too: kombu's Redis transport records
    a message as un-acked only once it has read it. The broker keeps its append-only file
    to show that, and a message it gave again un-acked (``acks_late``: a worker killed
    after a run, before its ack)."""
    start = 3.0 if at_a_send else 3.125
    return Case(
        name, task, 120, kill_loop(start), rate="4/s", capacity=1, acks_late=True, prefetch=4,
        funnels_aof=aof, ci=ci, pace=4.0 if paced else 0.0, broker="redis-aof",
    )  # fmt: skip


def _killed_holding_units(name: str, task: str, *, ci: bool = False) -> Case:
    """1500 instant tasks sent at 150/s through a 200/s funnel of capacity 40 (k = 10: the
    workers take units in batches, ``funnel_allowance``), a worker SIGKILLed and replaced
    every 3 s, 3 times, while they run: a worker killed holding units loses only those
    units. At 150/s every kill meets a send (kombu's window: the broker keeps its file to
    show it), and acks_late: a kill between a body's end and its ack runs that task
    again, with celery-funnel as without."""
    return Case(
        name, task, 1500, kill_loop(times=3), rate="200/s", capacity=40,
        acks_late=True, ci=ci, pace=150.0, broker="redis-aof",
    )  # fmt: skip


def _broker_restarted(name: str, task: str, *, ci: bool = True) -> Case:
    """The broker's Redis (AOF always) SIGKILLed and started again 3 times."""
    steps = restarts("broker", (2.0, 5.5, 9.0))
    return Case(name, task, 200, steps, broker="redis-aof", ci=ci)


def _funnels_restarted(name: str, task: str, *, aof: bool = False, ci: bool = True) -> Case:
    """The funnels' Redis SIGKILLed and started again twice."""
    return Case(name, task, 200, restarts("funnels", (3.0, 7.0)), funnels_aof=aof, ci=ci)


def _rabbitmq_cut(name: str, task: str, *, ci: bool = True) -> Case:
    return Case(name, task, 200, partition(), broker="amqp", proxied="broker", ci=ci)


# kombu's window (a message popped, not yet recorded: tests/faults/aof.py) meets these
# faults: each also runs on celery_funnel.transport, whose fetch closes it
_IN_KOMBUS_WINDOW = (
    _killed("kills at a send: FunnelTask, AOF", "faults.rate", aof=True, ci=False, at_a_send=True),
    _killed("kills at a send: plain Celery", "faults.plain", ci=False, at_a_send=True),
    _killed_holding_units("worker kills, units held: FunnelTask, 200/s", "faults.rate"),
    _killed_holding_units("worker kills, units held: plain Celery", "faults.plain"),
    _broker_restarted("broker restarts: FunnelTask", "faults.rate"),
    _broker_restarted("broker restarts: plain Celery", "faults.plain", ci=False),
)
_ON_THE_TRANSPORT = tuple(
    case.on_the_transport(ci=case.name.startswith("kills at a send: FunnelTask"))
    for case in _IN_KOMBUS_WINDOW
)

CASES: tuple[Case, ...] = (
    # (a) a 10 s partition between the workers and the funnels' Redis, 3 s in
    _partitioned("partition funnels: FunnelTask", "faults.rate"),
    _partitioned("partition funnels: worker gate", "faults.gated"),
    _partitioned("partition funnels: concurrency 2", "faults.slot", 40),
    _partitioned("partition funnels: FunnelTask, AOF", "faults.rate", aof=True),
    # (b) a worker SIGKILLed and replaced every 3 s, 6 times; the tasks sent at 4/s as
    # the kills go on (the funnel's rate: a backlog grows while a worker is down) ...
    _killed("worker kills: FunnelTask, AOF", "faults.rate", aof=True),
    _killed("worker kills: FunnelTask", "faults.rate"),
    _killed("worker kills: plain Celery", "faults.plain", ci=False),
    # ... each kill in the instant of a send (kombu's window, see _killed) ...
    *_IN_KOMBUS_WINDOW[:2],
    # ... or all sent at once before the first kill (parked at once, released at 4/s)
    _killed("worker kills, burst: FunnelTask, AOF", "faults.rate", aof=True, paced=False, ci=False),
    # ... or on a fast funnel whose units the workers take in batches (the allowance)
    *_IN_KOMBUS_WINDOW[2:4],
    # ... or killing runs mid-body (0.5 s each, two at once): acks_late is at-least-once,
    # a run killed mid-body runs again, with celery-funnel as without
    _killed("worker kills mid-body: concurrency 2, acks_late", "faults.started", ci=False),
    # (c) the broker's Redis SIGKILLed and started again 3 times
    _IN_KOMBUS_WINDOW[4],
    _broker_restarted("broker restarts: worker gate", "faults.gated", ci=False),
    _IN_KOMBUS_WINDOW[5],
    # (d) the funnels' Redis SIGKILLed and started again twice
    # (without AOF: in CI by test_restart.py, one restart each way a task waits)
    _funnels_restarted("funnels restarts: FunnelTask", "faults.rate", ci=False),
    _funnels_restarted("funnels restarts: FunnelTask, AOF", "faults.rate", aof=True),
    # (e) a 10 s partition between the workers and RabbitMQ, 3 s in
    _rabbitmq_cut("partition RabbitMQ: FunnelTask", "faults.rate"),
    _rabbitmq_cut("partition RabbitMQ: plain Celery", "faults.plain", ci=False),
    # (f) the faults that meet kombu's window, on celery_funnel.transport
    *_ON_THE_TRANSPORT,
)
CI_CASES = tuple(case for case in CASES if case.ci)
