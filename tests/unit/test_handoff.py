"""Held waiters woken when handed a seat, without a server: the hand-off listener
(``_celery.concurrency_handoff``) reading its worker's channel, the nudge
(``_gate.nudge``) that runs a call on the consumer's event loop at once from that
thread, and ``Held.wake_tasks`` deciding again only the held requests named."""

from __future__ import annotations

import queue
import select
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from celery_funnel._celery.concurrency_handoff import HandOffListener
from celery_funnel._gate.held import Held
from celery_funnel._gate.nudge import Nudge
from celery_funnel._limiter.keys import handed_channel
from celery_funnel._shared.state import State
from tests.polling import wait_for
from tests.unit.gate_fakes import Fakes, Timer


class Hub:
    """kombu's hub, as far as a nudge uses it: readers by file descriptor."""

    def __init__(self) -> None:
        self.readers: dict[int, Callable[[], Any]] = {}

    def add_reader(self, fd: int, callback: Callable[[], Any]) -> None:
        self.readers[fd] = callback

    def remove_reader(self, fd: int) -> None:
        self.readers.pop(fd, None)


def test_a_nudge_from_another_thread_wakes_the_hub_and_runs_once() -> None:
    hub, timer = Hub(), Timer()
    ran: list[str] = []
    nudge = Nudge(SimpleNamespace(hub=hub, timer=timer))

    def from_a_thread(value: str) -> None:
        thread = threading.Thread(target=nudge.call, args=(ran.append, value))
        thread.start()
        thread.join()

    from_a_thread("first")
    assert hub.readers == {}, "the hub's tables are changed on its loop only"
    timer.fire()  # the first call runs on the loop's timer, which watches the pipe
    assert ran == ["first"]
    ((fd, readable),) = hub.readers.items()
    from_a_thread("woken")
    assert select.select([fd], [], [], 1.0)[0] == [fd]  # the hub's poller wakes now
    readable()
    assert ran == ["first", "woken"]
    assert select.select([fd], [], [], 0.0)[0] == []  # drained
    timer.fire()  # the backstop entry finds nothing left
    assert ran == ["first", "woken"]
    nudge.close()
    assert hub.readers == {}


def test_without_a_hub_a_nudge_runs_on_the_timer() -> None:
    timer = Timer()
    ran: list[int] = []
    nudge = Nudge(SimpleNamespace(hub=None, timer=timer))
    nudge.call(ran.append, 1)
    nudge.call(ran.append, 2)
    assert ran == []
    timer.fire()
    assert ran == [1, 2]


def test_wake_tasks_decides_again_only_the_held_requests_named() -> None:
    with Fakes() as fakes:
        released: list[str] = []
        held = Held(fakes.runtime, fakes.consumer, lambda r, c, s: released.append(r.id))
        first, second = fakes.request(), fakes.request()
        for request in (first, second):
            held.hold(request, (), State.from_headers({}), 1.0)
        held.wake_tasks([second.id, "not-held-here"])
        assert released == []  # woken on the event loop, not in the caller's thread
        # the nudge's entry (no hub in the fakes), before the holds' own entries are due
        (entry,) = [e for e in fakes.timer.waiting if e.fn == held.nudge.run]
        fakes.timer.cancel(entry)
        entry.fn(*entry.args)
        assert released == [second.id]
        assert [r for r, *_ in held.listed()] == [first]


class PubSub:
    """redis-py's PubSub, as far as the listener uses it."""

    def __init__(self, messages: queue.Queue[dict[str, Any]], fail: list[bool]) -> None:
        self.messages, self.fail = messages, fail
        self.channels: list[str] = []
        self.closed = False

    def subscribe(self, channel: str) -> None:
        if self.fail and self.fail.pop(0):
            raise ConnectionError("the channel is down")
        self.channels.append(channel)

    def get_message(self, timeout: float = 0.0) -> dict[str, Any] | None:
        try:
            return self.messages.get(timeout=min(timeout, 0.05) or None, block=bool(timeout))
        except queue.Empty:
            return None

    def close(self) -> None:
        self.closed = True


def test_the_listener_wakes_each_waiter_told_of_and_subscribes_again_after_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(HandOffListener, "error_pause", 0.01)
    messages: queue.Queue[dict[str, Any]] = queue.Queue()
    made: list[PubSub] = []

    def pubsub(ignore_subscribe_messages: bool = False) -> PubSub:
        made.append(PubSub(messages, [True] if not made else []))
        return made[-1]

    woken: list[list[str]] = []
    listener = HandOffListener(
        lambda: SimpleNamespace(pubsub=pubsub), "app:", "w1@host", woken.append
    )
    assert listener.channel == handed_channel("app:", "w1@host") == "app:{~handed}#w1@host"
    listener.start()
    listener.start()  # once
    wait_for(lambda: len(made) == 2 and made[1].channels == [listener.channel], 5)
    for task_id in (b"a", b"b"):
        messages.put({"type": "message", "data": task_id})
    wait_for(lambda: [task_id for batch in woken for task_id in batch] == ["a", "b"], 5)
    listener.stop()
    assert made[0].closed
    assert made[1].closed
