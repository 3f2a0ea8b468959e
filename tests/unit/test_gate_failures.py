"""The worker gate on plain fakes (``tests/unit/gate_fakes.py``) when things fail: the
funnels' Redis (the outage policy), a revoke while a run is held, and errors in the
gate itself, none of which may reach Celery's consumer."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery.worker import state as worker_state

from celery_funnel._limiter.errors import BackendError, TooManyDeferralsError
from celery_funnel._shared.charges import OwnCharges
from tests.unit.gate_fakes import Fakes

PER_SECOND = {"fakes.*": "1/s"}


def test_defer_backs_off_on_the_timer_and_hands_back_at_the_deadline() -> None:
    """``funnel_on_backend_error="defer"`` (the default): held for a doubling back-off
    while its delivery may still be held, then handed back to the broker, never run
    unchecked and never failed."""
    with Fakes(PER_SECOND) as fakes:
        gate = fakes.gate()
        cap = fakes.runtime.countdowns.cap
        fakes.funnel.down = True
        request = fakes.request(received=time.monotonic() - cap + 1.5)  # 1.5 s left
        gate(request)
        assert [e.secs for e in fakes.timer.waiting] == [1.0], "the first back-off"
        fakes.advance(1.0)
        fakes.timer.fire()
        assert [e.secs for e in fakes.timer.waiting] == [pytest.approx(0.5, abs=0.05)], (
            "the next back-off (2 s) would pass what its delivery has left: held for that"
        )
        assert request.message.requeued is None
        fakes.advance(0.5)
        fakes.timer.fire()
        assert request.message.requeued is True, "handed back: the broker delivers it again"
        assert not request.message.acked
        assert fakes.ran == []
        assert fakes.backend.failed == {}
        assert fakes.timer.waiting == []


def test_defer_runs_the_task_once_the_funnels_answer_again() -> None:
    with Fakes(PER_SECOND) as fakes:
        gate = fakes.gate()
        fakes.funnel.down = True
        request = fakes.request()
        gate(request)
        assert fakes.ran == []
        fakes.funnel.down = False
        fakes.advance(1.0)
        fakes.timer.fire()
        assert fakes.ran == [request]
        assert request.header["outages"] == 1


def test_allow_runs_the_task_unlimited() -> None:
    with Fakes(PER_SECOND, {"funnel_on_backend_error": "allow"}) as fakes:
        gate = fakes.gate()
        fakes.funnel.down = True
        requests = [fakes.request(), fakes.request()]
        for request in requests:
            gate(request)
        assert fakes.ran == requests, "a full funnel would have held the second"


def test_raise_fails_the_task() -> None:
    with Fakes(PER_SECOND, {"funnel_on_backend_error": "raise"}) as fakes:
        gate = fakes.gate()
        fakes.funnel.down = True
        request = fakes.request()
        gate(request)
        assert fakes.ran == []
        assert isinstance(fakes.backend.failed[request.id], BackendError)
        assert request.message.acked
        assert [type_ for type_, _ in request.events] == ["task-failed"]


def test_a_run_deferred_more_than_funnel_max_deferrals_times_fails() -> None:
    with Fakes(PER_SECOND, {"funnel_max_deferrals": 1}) as fakes:
        gate = fakes.gate()
        first, second = fakes.request(), fakes.request()
        gate(first)
        gate(second)
        fakes.timer.fire()  # before its slot: refused a second time
        error = fakes.backend.failed[second.id]
        assert isinstance(error, TooManyDeferralsError)
        assert str(error).endswith("was deferred 1 time (funnel_max_deferrals=1)")
        assert second.message.acked
        assert fakes.ran == [first]


@pytest.mark.parametrize("seen_by", ["the sweep", "its timer"])
def test_a_revoked_held_run_ends_as_celery_ends_it_and_cancels_its_booking(
    seen_by: str,
) -> None:
    """Revoked while held (seen by the sweep, once a second, or when its timer fires
    first): REVOKED stored, acked, never run; the slot it booked goes to the next run."""
    with Fakes(PER_SECOND) as fakes:
        gate = fakes.gate()
        first, held = fakes.request(), fakes.request()
        gate(first)
        gate(held)
        assert held.header == {}
        assert len(fakes.timer.waiting) == 1
        worker_state.revoked.add(held.id)
        if seen_by == "the sweep":
            fakes.timer.tick()
            assert fakes.timer.waiting == [], "its timer entry is cancelled"
        else:
            fakes.timer.fire()
        assert fakes.backend.revoked == {held.id: "revoked"}
        assert held.message.acked
        assert gate.waiting() == {}
        assert fakes.consumer.qos.held == 0
        fakes.advance(1.0)
        third = fakes.request()
        gate(third)
        assert fakes.ran == [first, third], "the revoked run's slot was given back"


def _bad_key(task: Any) -> OwnCharges:
    def charges(*args: Any) -> Any:
        raise ValueError("funnel_key failed")

    return charges


def test_an_error_computing_a_charge_fails_that_task_only() -> None:
    with Fakes(PER_SECOND) as fakes:
        gate = fakes.gate(own_charges=_bad_key)
        request = fakes.request()
        assert gate(request) is None
        assert isinstance(fakes.backend.failed[request.id], ValueError)
        assert request.message.acked
        assert fakes.ran == []


def test_nothing_the_gate_raises_reaches_the_consumer() -> None:
    """The pool's hand-off raising fails the task; failing it raising too (the result
    backend gone) leaves the message to the broker, forgotten by the worker."""
    with Fakes(PER_SECOND) as fakes:

        def pool(request: Any) -> None:
            raise RuntimeError("the pool is gone")

        gate = fakes.gate()
        gate.handle = pool
        request = fakes.request()
        assert gate(request) is None
        assert isinstance(fakes.backend.failed[request.id], RuntimeError)

        fakes.backend.broken = True
        fakes.advance(1.0)
        again = fakes.request()
        assert gate(again) is None
        assert again.id not in fakes.backend.failed
        assert not again.message.acked
        assert again.message.requeued is None
        assert again.id not in worker_state.requests, "forgotten: the broker delivers it"

        cut = fakes.gate(own_charges=_bad_key)
        third = fakes.request()
        assert cut(third) is None
        assert not third.message.acked


class _Parking:
    """Parking that is on and records what it would park (no Redis here)."""

    on, backs_up = True, False

    def __init__(self) -> None:
        self.parked: list[str] = []

    def park(self, request: Any, *args: Any, **kwargs: Any) -> bool:
        self.parked.append(request.id)
        return True


@pytest.mark.parametrize("way", ["published again", "parked"])
def test_a_refused_run_past_its_deliverys_deadline_is_handed_back_not_moved(way: str) -> None:
    """Past three quarters of the broker's limit (a decision that came back late: a
    stalled event loop, a Redis that hung) the broker may have given the message to
    another worker, under the same copy token: a copy published or parked from it would
    run beside that one (seen: 6 tasks run twice in a 10 s cut to the funnels' Redis
    under load, each delivery moved 10.6-11.6 s after its receipt, the visibility
    timeout 10 s). It is handed back, as a run past the deadline is; nothing moves."""
    with Fakes({"fakes.*": "1/h"}) as fakes:
        gate = fakes.gate()
        parking = _Parking()
        if way == "parked":
            gate.waits.parking = parking  # type: ignore[assignment]
        limit = fakes.runtime.countdowns.limit
        first = fakes.request()
        late = fakes.request(received=time.monotonic() - 0.8 * limit)
        gate(first)
        gate(late)
        assert fakes.ran == [first]
        assert late.message.requeued is True, "handed back: the broker's own requeue"
        assert not late.message.acked
        assert fakes.publisher.published == []
        assert parking.parked == []
        assert fakes.timer.waiting == []
        on_time = fakes.request(received=time.monotonic() - 0.7 * limit)
        gate(on_time)
        moved = [p.task_id for p in fakes.publisher.published] + parking.parked
        assert moved == [on_time.id], "before the deadline the wait moves it, as before"
        assert on_time.message.acked
