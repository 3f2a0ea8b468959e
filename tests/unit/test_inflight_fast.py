"""The decisions in flight without Redis (issue 44): a reply that admits goes on as
``judge`` would answer and report it, without the decision replayed on it (the
scripts' ``admits`` agree with their decoding); any other reply is replayed; the
message leaves the consumer's prefetch window while its reply travels (``Window``),
within its bound, and comes back in when the reply is read."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from celery_funnel import signals
from celery_funnel._gate.arrival import Arrival, TaskOptions, subject_of
from celery_funnel._gate.inflight import InFlightDecisions
from celery_funnel._gate.window import Window
from celery_funnel._limiter.limit import Limit
from celery_funnel._limiter.memstore import MemoryStore
from celery_funnel._limiter.rate import Rate
from celery_funnel._limiter.strategies import gcra, reservation
from celery_funnel._shared.charges import Charge
from celery_funnel._shared.judge import RUN, Ruling, Subject, judge
from celery_funnel._shared.live import live_for
from celery_funnel._shared.state import State
from tests.unit.gate_fakes import T0, Fakes

ADMITTED = [0, 0, 5_000, 0]  # reserve.lua's reply: admitted, no delay
BOOKED = [1, 250_000, 500_000, 0]  # reserve.lua's reply: a slot booked 0.25 s away


class QoS:
    """kombu's ``QoS`` as the window sees it: a value, 0 for unbounded prefetching,
    capped at ``most`` (``worker_eta_task_limit``)."""

    def __init__(self, value: int, most: int | None = None) -> None:
        self.value, self.most = value, most

    def increment_eventually(self) -> int:
        if self.value:
            self.value = min(self.value + 1, self.most or self.value + 1)
        return self.value

    def decrement_eventually(self) -> int:
        if self.value:
            self.value = max(self.value - 1, 1)
        return self.value


def window(value: int, concurrency: int = 1, most: int | None = None) -> Window:
    controller = SimpleNamespace(concurrency=concurrency)
    return Window(SimpleNamespace(qos=QoS(value, most), controller=controller))


def test_the_window_keeps_one_message_out_per_pool_process_and_takes_it_back() -> None:
    w = window(2, concurrency=2)
    assert [w.leave(), w.leave(), w.leave()] == [True, True, False]  # the bound: 2
    assert (w.consumer.qos.value, w.out) == (4, 2)
    w.enter(True)
    w.enter(False)  # one that never left: nothing changes
    assert (w.consumer.qos.value, w.out) == (3, 1)
    w.forget()  # the connection closed: a new window
    w.enter(True)
    assert (w.consumer.qos.value, w.out) == (3, 0)


@pytest.mark.parametrize(("value", "most"), [(0, None), (4, 4)], ids=["unbounded", "eta limit"])
def test_the_window_leaves_nothing_where_it_cannot_grow(value: int, most: int | None) -> None:
    """Prefetching unbounded (0), or the window at ``worker_eta_task_limit``: no
    message leaves it, so none is taken back later (which would shrink it)."""
    w = window(value, most=most)
    assert w.leave() is False
    w.enter(False)
    assert w.consumer.qos.value == value


@pytest.mark.parametrize("reply", [ADMITTED, BOOKED, [2, 90_000_000, 0, 0], [3, -1, 0, 1]])
def test_reserve_admits_as_its_reply_decodes(reply: list[int]) -> None:
    op = reservation.ReserveOp([reservation.Shape("k", 0, 1, 1.0, 1)], "t")
    assert reservation.SCRIPT.admits is not None
    assert reservation.SCRIPT.admits(reply) == op.answer(reply).admitted


def test_gcra_admits_as_its_script_decides() -> None:
    store, admits = MemoryStore(), gcra.SCRIPT.admits
    assert gcra.SCRIPT.twin is not None
    assert admits is not None
    args: list[int | str] = [1_000_000, 1_000_000, str(int(T0 * 1e6))]  # 1/s, capacity 1, one unit
    replies = [gcra.SCRIPT.twin(store, ["k"], args) for _ in range(2)]
    assert [admits(r) for r in replies] == [True, False]


@pytest.fixture
def fakes() -> Iterator[Fakes]:
    with Fakes() as made:
        yield made


def _decisions(fakes: Fakes, steps: list[Ruling]) -> InFlightDecisions:
    def unreached(*args: Any) -> Any:
        raise AssertionError(f"not reached here: {args!r}")

    def decided(arrival: Arrival, step: Ruling, lease: Any) -> None:
        steps.append(step)

    live = live_for(fakes.app)
    inflight: Any = SimpleNamespace(replay=unreached)  # a replay would fail the test
    w = window(1)
    return InFlightDecisions(fakes.runtime, live, inflight, unreached, decided, unreached, w)


def _arrival(fakes: Fakes) -> Arrival:
    request = fakes.request()
    charge = Charge(Limit(Rate.parse("10/s")), "{f}:k", 1, "fakes.send")
    subject = Subject(request.name, request.id, "allow")
    return Arrival(request, [charge], (), State(), subject, fakes.delivery(request))


def test_a_reply_that_admits_goes_on_as_judge_reports_it_without_a_replay(fakes: Fakes) -> None:
    steps: list[Ruling] = []
    decisions = _decisions(fakes, steps)
    arrival = _arrival(fakes)
    assert decisions.window is not None
    assert decisions.window.leave()
    reported: list[dict[str, Any]] = []

    def admitted(sender: str, **fields: Any) -> None:
        reported.append({"sender": sender, **fields})

    signals.task_admitted.connect(admitted, weak=False)
    try:
        decide = partial(judge, fakes.runtime, arrival.subject, arrival.charges, arrival.state)
        decisions._resume(arrival, decide, reservation.SCRIPT.admits, True, ADMITTED)
    finally:
        signals.task_admitted.disconnect(admitted)
    assert steps == [RUN]
    assert [(r["sender"], r["task_id"], r["funnel"]) for r in reported] == [
        ("fakes.send", arrival.request.id, "fakes.send")
    ]
    assert (decisions.window.out, decisions.window.consumer.qos.value) == (0, 1)


def test_a_reply_that_refuses_is_decoded_by_the_decision_replayed(fakes: Fakes) -> None:
    steps: list[Ruling] = []
    decisions = _decisions(fakes, steps)
    arrival = _arrival(fakes)
    replayed: list[Any] = []
    fake: Any = SimpleNamespace(replay=lambda reply, fallback: replayed.append(reply))
    decisions.inflight = fake

    def decide(funnel: Any) -> Ruling:
        return Ruling(run=False, delay=0.25)

    decisions._resume(arrival, decide, reservation.SCRIPT.admits, False, BOOKED)
    assert replayed == [BOOKED]
    assert steps == [Ruling(run=False, delay=0.25)]


def test_a_tasks_options_are_read_once_per_task_type(fakes: Fakes) -> None:
    """``subject_of`` asks ``TaskOptions``, which reads a task type's options once."""
    asked: list[str] = []

    def own_options(task: Any) -> bool:
        asked.append(task.name)
        return False

    options = TaskOptions(fakes.runtime, own_options)
    settings = fakes.runtime.settings
    requests = [fakes.request("fakes.a"), fakes.request("fakes.a"), fakes.request("fakes.b")]
    subjects = [subject_of(r, options, None, "redis") for r in requests]
    assert asked == ["fakes.a", "fakes.b"]
    assert {(s.policy, s.dry_run) for s in subjects} == {
        (settings.on_backend_error, settings.dry_run)
    }
    assert [s.task_id for s in subjects] == [r.id for r in requests]
