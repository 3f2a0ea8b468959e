"""The recipe "add a way to wait" (docs/architecture.md), followed by a test: a toy way,
"hold twice as long", added from outside the package through the same three places a
way of the package has (its ``Way``, its rule in the wait policy, its act in
``Waits.acts``), then driven through the worker gate on plain fakes
(``tests/unit/gate_fakes.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_funnel import signals
from celery_funnel._config.waiting import WaitPolicy, Way
from celery_funnel._gate.arrival import Arrival
from celery_funnel._gate.waits import ACTS, Act, Plan, Waits
from celery_funnel._shared.judge import Ruling
from tests.unit.gate_fakes import Fakes

# 1. the way
TWICE = Way("held twice as long")


# 2. its rule: every wait the policy would hold is held twice as long
class TwicePolicy(WaitPolicy):
    def way(
        self,
        delay: float,
        hold: float,
        *,
        hold_left: float,
        until_expiry: float,
        parking: Callable[[], bool],
        queued: bool = False,
        outage: bool = False,
    ) -> Way:
        way = super().way(
            delay, hold, hold_left=hold_left, until_expiry=until_expiry, parking=parking,
            queued=queued, outage=outage,
        )  # fmt: skip
        return TWICE if way is Way.HOLD else way


# 3. its act: held on the timer for twice the hold, never past what its delivery has left
def hold_twice(waits: Waits, arrival: Arrival, step: Ruling, plan: Plan) -> None:
    twice = min(2 * plan.hold, plan.left)
    waits.hold(arrival, step.state._replace(waited=step.state.waited + twice), twice)


def test_a_toy_way_is_a_way_a_rule_and_an_act() -> None:
    with Fakes({"fakes.*": "1/s"}) as fakes:
        runtime = fakes.runtime
        runtime.waiting = TwicePolicy(runtime.waiting.countdowns, runtime.waiting.park_after)
        gate = fakes.gate()
        gate.waits.acts = {**ACTS, TWICE: Act("held", hold_twice)}
        deferred: list[str] = []

        def how(sender: Any, **fields: Any) -> None:
            deferred.append(fields["how"])

        first, second = fakes.request(), fakes.request()
        gate(first)
        signals.task_deferred.connect(how)
        try:
            gate(second)
        finally:
            signals.task_deferred.disconnect(how)
        [entry] = fakes.timer.waiting
        assert 1.8 < entry.secs <= 2.0, "the hold of its slot, a second away, twice over"
        assert deferred == ["held"], "reported in the public words"
        fakes.advance(entry.secs)
        fakes.timer.fire()
        assert fakes.ran == [first, second]
        assert second.header["waited"] == pytest.approx(entry.secs)


def test_without_its_act_a_way_is_an_error_of_the_gate_failing_that_task_only() -> None:
    """A way the policy chooses and the gate has no act for fails the run (``Failing.guarded``),
    not the worker: each way needs its row."""
    with Fakes({"fakes.*": "1/s"}) as fakes:
        runtime = fakes.runtime
        runtime.waiting = TwicePolicy(runtime.waiting.countdowns, runtime.waiting.park_after)
        gate = fakes.gate()
        first, second = fakes.request(), fakes.request()
        gate(first)
        assert gate(second) is None
        assert isinstance(fakes.backend.failed[second.id], KeyError)
        assert fakes.ran == [first]
