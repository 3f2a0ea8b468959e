"""A worker's allowances without Redis (issue 44): k from the rate, units spent once
each (from several threads too), dropped when their time is up or when the funnel is
overridden or paused, asked for only by the simple run; and through the gate on the
fakes, the twin taking k units in one call and the next runs admitted without one; a
funnel decided sparsely takes none."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_funnel import signals
from celery_funnel._gate.allowance import KEYS, Allowances
from celery_funnel._gate.arrival import Arrival
from celery_funnel._gate.inflight_connection import InFlight
from celery_funnel._limiter.limit import Limit
from celery_funnel._limiter.rate import Rate
from celery_funnel._limiter.scripts import Call
from celery_funnel._limiter.strategies import allowance, reservation
from celery_funnel._limiter.strategies.reservation import ReserveOp, Shape
from celery_funnel._shared.charges import Charge
from celery_funnel._shared.judge import Subject
from celery_funnel._shared.live import live_for
from celery_funnel._shared.overrides import Override
from celery_funnel._shared.state import State
from tests.unit.gate_fakes import Fakes

LEASED = [0, 0, 50_000, 0, 10]  # allowance.lua's reply: 10 units taken
FAST = Limit(Rate.parse("200/s"), capacity=400)  # k = 10


@pytest.fixture
def fakes() -> Iterator[Fakes]:
    limits = {"fakes.*": {"rate": "200/s", "capacity": 400}}
    with Fakes(limits=limits, conf={"funnel_allowance": True}) as made:
        yield made


@pytest.mark.parametrize(
    ("rate", "capacity", "k"),
    [("20/s", 40, 1), ("39/s", 100, 1), ("40/s", 100, 2), ("200/s", 400, 10),
     ("200/s", 6, 3), ("5000/s", 10_000, 64), ("100/m", 1000, 0)],
)  # fmt: skip
def test_k_is_the_rates_worth_in_the_allowance_time_within_its_bounds(
    rate: str, capacity: int, k: int
) -> None:
    assert allowance.units(Rate.parse(rate), capacity) == k


def _arrival(fakes: Fakes, limit: Limit = FAST, cost: int = 1, **state: Any) -> Arrival:
    request = fakes.request()
    charge = Charge(limit, "{fakes}:k", cost, "fakes.send")
    subject = Subject(request.name, request.id, "allow")
    return Arrival(request, [charge], (), State(**state), subject, fakes.delivery(request))


def _reserve(arrival: Arrival) -> Call:
    limit = arrival.charges[0].limit
    shape = Shape(arrival.charges[0].key, limit.capacity - 1, limit.rate.count, limit.rate.period)
    return ReserveOp([shape], arrival.request.id).call()


def _held(fakes: Fakes, units: int = 10) -> tuple[Allowances, Arrival]:
    allowances = Allowances(fakes.runtime, live_for(fakes.app))
    arrival = _arrival(fakes)
    allowances.keep("{fakes}:k", time.monotonic(), [*LEASED[:4], units])
    return allowances, arrival


def test_each_unit_is_spent_once(fakes: Fakes) -> None:
    allowances, arrival = _held(fakes)
    assert [allowances.spend(arrival) for _ in range(10)] == [True] * 9 + [False]
    assert allowances.taken == {}


def test_units_from_several_threads_are_spent_once_each(fakes: Fakes) -> None:
    allowances, arrival = _held(fakes, 2001)  # 2000 beyond the reply's own run
    spent: list[bool] = []

    def spend() -> None:
        mine = [allowances.spend(arrival) for _ in range(600)]
        spent.extend(mine)  # list.extend is atomic

    threads = [threading.Thread(target=spend) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert spent.count(True) == 2000


def test_units_are_dropped_when_their_time_is_up(fakes: Fakes) -> None:
    allowances = Allowances(fakes.runtime, live_for(fakes.app))
    arrival = _arrival(fakes)
    allowances.keep("{fakes}:k", time.monotonic() - allowance.SECONDS, LEASED)
    assert allowances.spend(arrival) is False
    assert allowances.taken == {}


def test_units_of_many_funnel_keys_past_their_time_are_forgotten(fakes: Fakes) -> None:
    allowances = Allowances(fakes.runtime, live_for(fakes.app))
    old = time.monotonic() - allowance.SECONDS
    for n in range(KEYS):
        allowances.keep(f"{{fakes}}:{n}", old, LEASED)
    assert len(allowances.taken) == KEYS
    allowances.keep("{fakes}:k", time.monotonic(), LEASED)  # one more: the sweep
    assert list(allowances.taken) == ["{fakes}:k"]


def test_newer_units_never_stretch_older_ones_time(fakes: Fakes) -> None:
    allowances = Allowances(fakes.runtime, live_for(fakes.app))
    early = time.monotonic() - allowance.SECONDS / 2
    allowances.keep("{fakes}:k", early, LEASED)
    allowances.keep("{fakes}:k", time.monotonic(), LEASED)
    assert allowances.taken["{fakes}:k"] == (18, early + allowance.SECONDS, 18)


def test_a_worker_asks_for_what_it_spent_in_its_last_allowances_time(fakes: Fakes) -> None:
    allowances, arrival = _held(fakes)  # 9 units held, k = 10 from the rate
    allowances.loaded = True
    assert [allowances.spend(arrival), allowances.spend(arrival)] == [True, True]
    allowances.taken["{fakes}:k"] = (7, time.monotonic() - 1, 9)  # their time is up
    assert allowances.spend(arrival) is False
    assert allowances.wanted(arrival, arrival.charges, _reserve(arrival))[0][2][-1] == 3
    allowances.keep("{fakes}:k", time.monotonic(), [*LEASED[:4], 3])
    assert [allowances.spend(arrival), allowances.spend(arrival)] == [True, True]  # all, in time
    assert allowances.wanted(arrival, arrival.charges, _reserve(arrival))[0][2][-1] == 6
    allowances.sizes["{fakes}:k"] = 64
    allowances.asking.clear()  # as if its reply had come
    assert allowances.wanted(arrival, arrival.charges, _reserve(arrival))[0][2][-1] == 10


@pytest.mark.parametrize("entry", [Override(paused=True), Override(rate=Rate.parse("1/s"))])
def test_an_override_or_a_pause_drops_the_units_at_once(fakes: Fakes, entry: Override) -> None:
    allowances, arrival = _held(fakes)
    assert allowances.spend(arrival)
    table = live_for(fakes.app).overrides
    table.load({"fakes.send": entry.to_json()})
    assert allowances.spend(arrival) is False
    table.load({})
    assert allowances.spend(arrival) is False  # gone, not only set aside
    assert allowances.taken == {}


def test_the_simple_run_asks_for_k_units_once_the_funnel_is_decided_densely(
    fakes: Fakes,
) -> None:
    allowances = Allowances(fakes.runtime, live_for(fakes.app))
    allowances.loaded = True  # as if allowance.lua were loaded on Redis
    arrival = _arrival(fakes)
    first = _reserve(arrival)
    assert allowances.wanted(arrival, arrival.charges, first) == (first, None)  # alone
    call, keep = allowances.wanted(arrival, arrival.charges, _reserve(arrival))
    assert call[0] is allowance.SCRIPT
    assert call[2][allowance.UNITS_ARG] == 10
    assert keep is not None


def test_one_call_at_a_time_asks_for_units_until_its_reply_or_their_time(fakes: Fakes) -> None:
    """So a worker never holds more than k units of a funnel taken before any moment:
    the bound's k x workers."""
    allowances = Allowances(fakes.runtime, live_for(fakes.app))
    allowances.loaded = True
    arrival = _arrival(fakes)
    allowances.decided["{fakes}:k"] = time.monotonic()  # a run decided just before
    _, keep = allowances.wanted(arrival, arrival.charges, _reserve(arrival))
    assert keep is not None
    assert allowances.wanted(arrival, arrival.charges, _reserve(arrival))[1] is None
    keep(ConnectionError("lost"))  # any reply, an error too: another call may ask
    assert allowances.wanted(arrival, arrival.charges, _reserve(arrival))[1] is not None
    allowances.asking["{fakes}:k"] -= allowance.SECONDS  # a reply never came: its time is up
    assert allowances.wanted(arrival, arrival.charges, _reserve(arrival))[1] is not None


def test_a_funnel_decided_sparsely_takes_no_units(fakes: Fakes) -> None:
    """A run decided more than SECONDS after this worker's previous one of the funnel
    is decided alone: so a hold (funnel_backoff) its previous run set is seen at once."""
    allowances = Allowances(fakes.runtime, live_for(fakes.app))
    allowances.loaded = True
    arrival = _arrival(fakes)
    for _ in range(3):
        allowances.decided["{fakes}:k"] = time.monotonic() - allowance.SECONDS * 1.5
        call = _reserve(arrival)
        assert allowances.wanted(arrival, arrival.charges, call) == (call, None)
    old = time.monotonic() - allowance.SECONDS * 2
    allowances.decided = {f"{{fakes}}:{n}": old for n in range(KEYS)}
    allowances.wanted(arrival, arrival.charges, _reserve(arrival))  # one more: the sweep
    assert list(allowances.decided) == ["{fakes}:k"]


@pytest.mark.parametrize(
    "change",
    ["rate 20/s", "cost 2", "deferred", "booked", "two funnels", "expires", "setting off"],
)
def test_any_other_run_is_decided_alone(fakes: Fakes, change: str) -> None:
    allowances = Allowances(fakes.runtime, live_for(fakes.app))
    allowances.loaded = True
    limit = Limit(Rate.parse("20/s"), capacity=400) if change == "rate 20/s" else FAST
    arrival = _arrival(
        fakes, limit, cost=2 if change == "cost 2" else 1,
        deferrals=int(change == "deferred"), booked=change == "booked",
    )  # fmt: skip
    if change == "two funnels":
        arrival = arrival._replace(charges=[*arrival.charges, arrival.charges[0]])
    if change == "expires":
        subject = Subject(arrival.subject.name, arrival.subject.task_id, "allow", expires_in=9.0)
        arrival = arrival._replace(subject=subject)
    if change == "setting off":
        fakes.app.conf.funnel_allowance = False
        fakes.runtime.__dict__.pop("settings", None)
    call = _reserve(arrival)
    assert allowances.wanted(arrival, arrival.charges, call) == (call, None)
    allowances.keep("{fakes}:k", time.monotonic(), LEASED)
    assert allowances.spend(arrival) is (change in ("rate 20/s", "setting off"))


class Sent:
    """The gate's connection for decisions in flight, on the fakes: each call runs its
    script's twin on the fakes' funnel, and its reply is read at once."""

    capture, replay = staticmethod(InFlight.capture), staticmethod(InFlight.replay)

    def __init__(self, fakes: Fakes) -> None:
        self.fakes, self.on = fakes, True
        self.calls: list[Call] = []

    def send(self, call: Call, resume: Any) -> None:
        self.calls.append(call)
        resume(self.fakes.funnel._eval(*call))

    def deferred(self) -> None:
        self.on = False


def test_the_gate_takes_k_units_in_one_call_and_admits_the_next_runs_without_one(
    fakes: Fakes,
) -> None:
    gate = fakes.gate()
    sent = Sent(fakes)
    gate.inflight = gate.decisions.inflight = sent  # type: ignore[assignment]
    gate.decisions.window = None  # the fakes' consumer keeps no prefetch window
    assert gate.decisions.allowances is not None
    gate.decisions.allowances.loaded = True
    admitted: list[str] = []

    def count(sender: str, **fields: Any) -> None:
        admitted.append(fields["task_id"])

    signals.task_admitted.connect(count, weak=False)
    try:
        requests = [fakes.request() for _ in range(21)]
        for request in requests:
            gate(request)
    finally:
        signals.task_admitted.disconnect(count)
    assert [r.id for r in fakes.ran] == [r.id for r in requests]
    assert admitted == [r.id for r in requests]  # every run reported once
    # 21 runs, k = 10: the first decided alone, the next two calls take 10 each
    assert [call[0] for call in sent.calls] == [reservation.SCRIPT] + [allowance.SCRIPT] * 2
    (key,) = fakes.funnel.store.keys()
    tat = int(fakes.funnel.store.get(key) or 0)  # 21 units charged, 1 spent per run
    assert tat - round(fakes.clock.now * 1e6) == 21 * 5000
