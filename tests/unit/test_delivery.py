"""A delivery's times, and the outage log's probe: no call waits on a Redis known to
fail (plain objects: the times are arithmetic, the probe a callable)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from celery_funnel._config.countdown import CountdownPolicy
from celery_funnel._config.outage import OutageLog
from celery_funnel._limiter.errors import BackendError
from celery_funnel._shared.delivery import RECEIVED_AT, delivery_of, overdue
from tests.polling import wait_for

BROKER = CountdownPolicy(cap=10.0, limit=20.0)  # the default: the cap is half the limit


def request(received: float | None, redelivered: bool = False) -> Any:
    message = SimpleNamespace()
    if received is not None:
        setattr(message, RECEIVED_AT, received)
    return SimpleNamespace(message=message, delivery_info={"redelivered": redelivered})


def test_a_delivery_counts_from_its_receipt_not_from_the_gates_first_sight() -> None:
    """An ETA message sits un-acked from its receipt: its countdown is spent already
    when the gate first sees it."""
    received = time.monotonic() - 8.0  # received 8 s ago, held for its ETA since
    delivery = delivery_of(request(received), BROKER)
    assert delivery.hold_left() == pytest.approx(2.0, abs=0.05)
    assert not delivery.past_deadline()
    assert delivery.past_deadline(received + 15.0), "three quarters of the broker's limit"
    assert delivery.past_deadline(received + 15.0) == overdue(_with(delivery), received + 15)
    assert not delivery.past_hands_off(received + 17.9)
    assert delivery.past_hands_off(received + 18.0), "nine tenths of the broker's limit"


def test_a_lowered_cap_shortens_the_holds_not_the_deadlines() -> None:
    """funnel_max_countdown = 1 s under a 20 s visibility timeout: the gate plans waits
    of 1 s at most, but a message sent with a 2 s ETA still runs at its ETA (before the
    fix its deadline was 1.5 caps: it was left to the broker for the whole 20 s)."""
    received = time.monotonic() - 2.0
    delivery = delivery_of(request(received), CountdownPolicy(cap=1.0, limit=20.0))
    assert delivery.hold_left() == 0.0
    assert not delivery.past_deadline()
    assert not delivery.past_hands_off()


def test_a_cap_past_half_the_limit_holds_no_longer_than_half() -> None:
    """A funnel_max_countdown above half the broker's limit: waits in place still end
    by half the limit, so that the deadline stays ahead of them."""
    received = time.monotonic()
    delivery = delivery_of(request(received), CountdownPolicy(cap=100.0, limit=20.0))
    assert delivery.hold_until == pytest.approx(received + 10.0)
    assert delivery.deadline == pytest.approx(received + 15.0)


def _with(delivery: Any) -> Any:
    found = SimpleNamespace()
    found._celery_funnel_delivery = delivery
    return found


def test_a_delivery_is_read_once_and_knows_a_redelivery() -> None:
    first = request(None)
    assert delivery_of(first, BROKER) is delivery_of(first, BROKER)
    assert not delivery_of(first, BROKER).unchecked(""), "as first sent, delivered once"
    assert delivery_of(first, BROKER).unchecked("token"), "a copy carrying a token"
    again = delivery_of(request(None, redelivered=True), BROKER)
    assert again.unchecked(""), "delivered again by the broker"
    again.accepted = True
    assert not again.unchecked("")


def test_no_call_waits_on_a_redis_known_to_fail_until_the_probe_sees_it_answer() -> None:
    up = threading.Event()
    probes: list[float] = []

    def probe() -> None:
        probes.append(time.monotonic())
        if not up.is_set():
            raise ConnectionError("no route")

    log = OutageLog(probe=probe)
    log.check()  # nothing known to fail: calls go
    log.failed(TimeoutError("hung"), "defer")
    with pytest.raises(BackendError, match="has not answered"):
        log.check()
    wait_for(lambda: len(probes) >= 2, 5)
    with pytest.raises(BackendError):
        log.check()
    up.set()
    wait_for(lambda: not log.down, 5)
    log.check()


def test_without_a_probe_calls_go_on_through_an_outage() -> None:
    log = OutageLog()
    log.failed(TimeoutError("hung"), "defer")
    assert log.down
    log.check()  # nothing watches the backend: each call finds out for itself
