"""The worker gate on plain fakes (``tests/unit/gate_fakes.py``): what it passes on to
the pool, and how a refused run waits (held on the consumer's timer, or published again
with the capped countdown), decided on a ``MemoryFunnel``."""

from __future__ import annotations

import pytest

from celery_funnel._config.outage import BACKOFF_FIRST_SECONDS
from celery_funnel._gate.state import HEADER, State, admitted_by_gate
from tests.unit.gate_fakes import Fakes

PER_SECOND = {"fakes.*": "1/s"}  # GCRA, capacity 1: one run, the next a second later
LABEL = "limit:fakes.*"


def test_a_request_no_funnel_applies_to_goes_straight_on() -> None:
    with Fakes({"other.*": "1/s"}) as fakes:
        gate = fakes.gate()
        first, second = fakes.request(), fakes.request()
        gate(first)
        gate(second)
        assert fakes.ran == [first, second]
        assert first.header == {}, "nothing decided it: no mark"
        assert not first.message.acked, "Celery acks it, after its run"
        assert fakes.timer.waiting == []


def test_an_admitted_run_is_passed_to_the_pool_once_marked_in_its_header() -> None:
    with Fakes(PER_SECOND) as fakes:
        gate = fakes.gate()
        request = fakes.request()
        assert gate(request) is None
        assert fakes.ran == [request]
        assert admitted_by_gate(request.request_dict), "FunnelTask.before_start lets it by"
        assert State.from_headers({HEADER: request.header}).deferrals == 0
        assert not request.message.acked
        assert gate.waiting() == {}


def test_a_short_wait_is_held_on_the_timer_then_admitted_when_it_fires() -> None:
    with Fakes(PER_SECOND) as fakes:
        gate = fakes.gate()
        first, second = fakes.request(), fakes.request()
        gate(first)
        gate(second)
        assert fakes.ran == [first], "the funnel is full for a second"
        [entry] = fakes.timer.waiting
        assert 0.9 < entry.secs <= 1.0, "held until its booked slot (a hair early)"
        assert gate.waiting() == {LABEL: 1}
        assert fakes.consumer.qos.held == 1, "out of the prefetch window while it waits"
        assert not second.message.acked
        fakes.advance(1.0)
        assert fakes.timer.fire() == 1
        assert fakes.ran == [first, second]
        assert second.header["deferrals"] == 1
        assert second.header["booked"], "admitted on the slot it booked"
        assert admitted_by_gate(second.request_dict)
        assert gate.waiting() == {}
        assert fakes.consumer.qos.held == 0


def test_a_long_wait_is_published_again_capped_and_the_original_acked_after() -> None:
    with Fakes({"fakes.*": "1/h"}) as fakes:
        gate = fakes.gate()
        cap = fakes.runtime.countdowns.cap
        first, second = fakes.request(), fakes.request()
        gate(first)
        gate(second)
        assert fakes.ran == [first]
        [published] = fakes.publisher.published
        assert published.task_id == second.id
        assert published.countdown == cap, "an hour's wait, published for the cap"
        assert published.state["deferrals"] == 1
        assert published.state["requeues"] == 1
        assert published.state["waited"] == cap
        assert published.state["booked"], "the copy redeems the slot it booked"
        assert fakes.journal[-2:] == [("publish", second.id), ("ack", second.id)]
        assert fakes.timer.waiting == []


def test_a_publish_that_fails_keeps_the_original_and_tries_again() -> None:
    with Fakes({"fakes.*": "1/h"}) as fakes:
        gate = fakes.gate()
        first, second = fakes.request(), fakes.request()
        gate(first)
        fakes.publisher.broken = True
        gate(second)
        assert not second.message.acked, "nothing published: the message is kept"
        [entry] = fakes.timer.waiting
        assert entry.secs == pytest.approx(BACKOFF_FIRST_SECONDS)
        fakes.publisher.broken = False
        fakes.advance(BACKOFF_FIRST_SECONDS)
        fakes.timer.fire()
        assert [p.task_id for p in fakes.publisher.published] == [second.id]
        assert fakes.journal[-2:] == [("publish", second.id), ("ack", second.id)]
        assert fakes.ran == [first]


@pytest.mark.parametrize(
    ("broker", "urgent", "lax"),
    [("redis://127.0.0.1:1/0", 0, 9), ("amqp://guest@127.0.0.1:1//", 9, 0)],
    ids=["redis: 0 first", "amqp: 9 first"],
)
def test_a_more_urgent_request_takes_the_earlier_slot_in_its_brokers_order(
    broker: str, urgent: int, lax: int
) -> None:
    """The gate ranks a request's priority in the order of the app's broker transport
    (kombu's Redis transport serves 0 first, AMQP the larger number): of two requests
    refused one after the other, the more urgent one, sent second, takes the slot the
    first booked, and that one books anew behind it."""
    with Fakes(PER_SECOND, {"broker_url": broker}) as fakes:
        gate = fakes.gate()
        first, lax_one, urgent_one = fakes.request(), fakes.request(), fakes.request()
        lax_one.delivery_info["priority"] = lax
        urgent_one.delivery_info["priority"] = urgent
        for request in (first, lax_one, urgent_one):
            gate(request)
        assert fakes.ran == [first]
        fakes.advance(1.0)
        fakes.timer.fire()
        assert fakes.ran == [first, urgent_one], "the urgent one runs on the first slot"
        fakes.advance(1.0)
        fakes.timer.fire()
        assert fakes.ran == [first, urgent_one, lax_one]
