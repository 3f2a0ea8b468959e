"""Held requests, without a server: two messages of one task id held at once (two
sends of it, or a copy and the original delivered again) are each decided again when
their time comes. Before, the held table was keyed by task id: the later hold replaced
the earlier, whose message then stayed un-acked, never decided again."""

from __future__ import annotations

from celery_funnel._gate.held import Held
from celery_funnel._shared.state import State
from tests.unit.gate_fakes import Fakes


def test_two_requests_of_one_task_id_held_at_once_are_each_decided_again() -> None:
    with Fakes() as fakes:
        released: list[object] = []
        held = Held(fakes.runtime, fakes.consumer, lambda r, c, s: released.append(r))
        first, second = fakes.request(), fakes.request()
        second.id = first.id  # another send of the same task id
        held.hold(first, (), State.from_headers({}), 1.0)
        held.hold(second, (), State.from_headers({}), 1.0)
        assert len(held) == 2
        fakes.timer.fire()
        assert released == [first, second]
        assert len(held) == 0
        held.hold(first, (), State.from_headers({}), 1.0)
        held.hold(second, (), State.from_headers({}), 1.0)
        held.forget(second)  # failed or passed on: the other stays held
        assert [r for r, *_ in held.listed()] == [first]
