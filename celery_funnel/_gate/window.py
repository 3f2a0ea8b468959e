"""The consumer's prefetch window and the decisions in flight (``inflight``): a message
whose decision is in flight is kept out of the window while its reply travels, as
Celery keeps ETA tasks and the gate its held requests (``held``) out of it, so that the
consumer fetches the next message meanwhile. At ``worker_prefetch_multiplier=1`` the
decision's round trip is then no longer in series with the fetch of every message.

Bounded: at most ``concurrency`` decisions (one per pool process) are out of the window
at once; a decision sent past that counts against the window as before. So a worker
holds at most ``concurrency x multiplier + concurrency`` un-acked messages that are
neither running nor held (twice Celery's own window at ``multiplier=1``). Nothing is
acked earlier: a worker killed meanwhile loses nothing (the broker delivers its un-acked
messages again). A decision's message goes back into the window when its reply is
read (or when the decision is given up), before the run is passed on or made to wait.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

__all__ = ["Window"]


class Window:
    """The prefetch window of ``consumer`` (its ``qos``: kombu's ``QoS``, changed only
    "eventually": the consumer's loop applies the count before its next poll)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.out = 0  # decisions in flight kept out of the window now

    @cached_property
    def bound(self) -> int:
        """How many may be out at once: one per pool process."""
        concurrency = getattr(getattr(self.consumer, "controller", None), "concurrency", 1)
        return max(int(concurrency or 1), 1)

    def leave(self) -> bool:
        """Keep one more message out of the window, if the bound allows and the window
        grows (not when prefetching is unbounded, 0, nor at ``worker_eta_task_limit``).
        Returns whether it did: pass that to ``enter``."""
        qos = getattr(self.consumer, "qos", None)
        if qos is None or self.out >= self.bound:
            return False
        before = qos.value
        if qos.increment_eventually() <= before:
            return False
        self.out += 1
        return True

    def enter(self, left: bool) -> None:
        """The message is back in the window (``left``: ``leave`` took it out)."""
        if left and self.out > 0:
            self.out -= 1
            self.consumer.qos.decrement_eventually()

    def forget(self) -> None:
        """The broker connection closed: its window goes with it (the consumer makes a
        new one), and the decisions in flight are dropped."""
        self.out = 0
