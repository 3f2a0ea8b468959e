"""A delivery's two times, and the outage log's probe: no call waits on a Redis known to
fail (plain objects: the times are arithmetic, the probe a callable)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from celery_funnel._config.outage import OutageLog
from celery_funnel._gate.delivery import RECEIVED_AT, delivery_of, overdue
from celery_funnel._limiter.errors import BackendError
from tests.polling import wait_for


def request(received: float | None, redelivered: bool = False) -> Any:
    message = SimpleNamespace()
    if received is not None:
        setattr(message, RECEIVED_AT, received)
    return SimpleNamespace(message=message, delivery_info={"redelivered": redelivered})


def test_a_delivery_counts_from_its_receipt_not_from_the_gates_first_sight() -> None:
    """An ETA message sits un-acked from its receipt: its countdown is spent already
    when the gate first sees it."""
    received = time.monotonic() - 8.0  # received 8 s ago, held for its ETA since
    delivery = delivery_of(request(received), cap=10.0)
    assert delivery.hold_left() == pytest.approx(2.0, abs=0.05)
    assert not delivery.past_deadline()
    assert delivery.past_deadline(received + 15.0), "1.5 caps after the receipt"
    assert delivery.past_deadline(received + 15.0) == overdue(_with(delivery), received + 15)


def _with(delivery: Any) -> Any:
    found = SimpleNamespace()
    found._celery_funnel_delivery = delivery
    return found


def test_a_delivery_is_read_once_and_knows_a_redelivery() -> None:
    first = request(None)
    assert delivery_of(first, 10.0) is delivery_of(first, 10.0)
    assert not delivery_of(first, 10.0).unchecked(""), "as first sent, delivered once"
    assert delivery_of(first, 10.0).unchecked("token"), "a copy carrying a token"
    again = delivery_of(request(None, redelivered=True), 10.0)
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
