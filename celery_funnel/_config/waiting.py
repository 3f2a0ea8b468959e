"""The wait policy (``WaitPolicy``): how a run a funnel refused waits, chosen in this one
place and asked by every place that makes a run wait (the worker gate's ``Waits``, its
concurrency ``Seats`` and paused funnels, ``FunnelTask.before_start``).

The ways (``Way``), for a wait of ``delay`` seconds:

- ``PARK``: kept in the funnels' Redis until its release time, where parking is on
  (``_stores.persistence``), the wait is longer than ``funnel_park_after`` (at most the
  countdown cap) and ends before the task expires, and the funnels' Redis is not the
  one failing (an outage back-off); or always, a run queued on a fair-share funnel;
- ``HOLD``: held on the consumer's timer when the hold ends by its delivery's
  ``hold_until`` (``_shared.delivery``), or when the wait is too short to publish (under
  a second on a broker that delays by whole seconds); outside the gate (a
  FunnelTask's ``before_start``): slept in place, when eager or too short to publish;
- ``BACK_OFF``: the funnels' Redis fails and the hold would pass ``hold_until``: held
  for what the delivery has left, then handed back to the broker;
- ``PUBLISH``: published again as a new copy with the capped countdown;
- ``WAITER``: refused a seat, with parking on: parked with no release time and queued
  for one (published again when a seat is handed to it, or checked again after
  ``WAITER_SECONDS``). With parking off a run refused a seat is a held waiter: queued
  the same way, held in its worker (``HOLD``, or as ``way`` says past what its delivery
  may be held), woken at once when a seat is handed to it, and looking again every
  ``LOOK_SECONDS`` should it not be told; its place lasts ``HELD_MARK_SECONDS`` past
  its last look (its worker died: it leaves the queue).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from .countdown import CountdownPolicy

__all__ = [
    "HELD_MARK_SECONDS", "LOOK_SECONDS", "PAUSED_HOLD_SECONDS", "PAUSED_PARK_SECONDS",
    "WAITER_SECONDS",
    "WaitPolicy", "Way",
]  # fmt: skip

# A waiter is released when a seat is handed to it; failing that (its queue deleted by
# ``reset``), after an hour, to be checked again, keeping its place in the queue (a
# waiter not queued yet, its worker killed or Redis failing between the park and the
# queueing, is released sooner: ``_gate.parking.QUEUE_GRACE_SECONDS``).
WAITER_SECONDS = 3600.0
# how often a waiter held in its worker (nothing parked) looks again, should the
# hand-off of a seat not reach it (its worker's channel was down)
LOOK_SECONDS = 1.0
# how long a held waiter keeps its place (and a seat handed to it) past its last look
HELD_MARK_SECONDS = 5.0
PAUSED_PARK_SECONDS = 60.0  # a paused funnel's task is parked this long at most
PAUSED_HOLD_SECONDS = 0.5  # with parking off, held this long between two looks


@dataclass(frozen=True)
class Way:
    """How a refused run waits (see the module), ``name``d; the gate acts on it
    (``_gate.waits.ACTS``). A way is added as docs/architecture.md says ("Recipe: add a
    way to wait")."""

    name: str

    HOLD: ClassVar[Way]
    PARK: ClassVar[Way]
    PUBLISH: ClassVar[Way]
    BACK_OFF: ClassVar[Way]
    WAITER: ClassVar[Way]


Way.HOLD = Way("held")
Way.PARK = Way("parked")
Way.PUBLISH = Way("republished")
Way.BACK_OFF = Way("backed off")
Way.WAITER = Way("waiter")


@dataclass(frozen=True)
class WaitPolicy:
    """The wait policy of one app: ``countdowns`` (the broker's countdown cap), and
    ``park_after`` (``funnel_park_after``, at most the cap: ``of``)."""

    countdowns: CountdownPolicy
    park_after: float

    @classmethod
    def of(cls, park_after: float, countdowns: CountdownPolicy) -> WaitPolicy:
        """The policy for the setting ``park_after`` and the broker's ``countdowns``."""
        return cls(countdowns, min(park_after, countdowns.cap))

    def parks(
        self, delay: float, until_expiry: float, *, parking: Callable[[], bool], outage: bool
    ) -> bool:
        """Whether a wait of ``delay`` seconds is parked (``until_expiry``: seconds
        left before the task expires; ``parking()``: whether parking is on now, asked
        first, and only here: it reads the funnels' Redis now and then)."""
        return parking() and not outage and self.park_after < delay < until_expiry

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
        """How the gate makes a run wait ``delay`` seconds (``hold``: what a hold on
        the timer would last; ``hold_left``: seconds until its delivery's
        ``hold_until``; ``parking()``: whether parking is on, asked unless ``queued``:
        on a fair-share funnel's queue; ``outage``: an outage back-off): ``PARK``,
        ``HOLD``, ``BACK_OFF`` or ``PUBLISH``."""
        if queued or self.parks(delay, until_expiry, parking=parking, outage=outage):
            return Way.PARK
        if hold <= hold_left or self.countdowns.waits_in_place(delay):
            return Way.HOLD
        return Way.BACK_OFF if outage else Way.PUBLISH

    def in_task(self, delay: float, *, eager: bool) -> Way:
        """How a run decided outside the gate (``FunnelTask.before_start``) waits:
        ``HOLD`` (slept in place) when eager or too short to publish, else
        ``PUBLISH``."""
        if eager or self.countdowns.waits_in_place(delay):
            return Way.HOLD
        return Way.PUBLISH

    @staticmethod
    def for_seat(*, parking: bool) -> tuple[Way, float]:
        """How a run refused a seat waits, and how long at most: ``WAITER`` for
        ``WAITER_SECONDS`` with parking on, else ``LOOK_SECONDS`` (a held waiter,
        woken sooner when handed a seat), waited as ``way`` says (``HOLD`` stands for
        that)."""
        if parking:
            return Way.WAITER, WAITER_SECONDS
        return Way.HOLD, LOOK_SECONDS

    @staticmethod
    def paused(*, parking: bool) -> float:
        """How long a run of a paused funnel waits before it is looked at again:
        parked (a resume releases it at once) with parking on, else held briefly (the
        live table is local: looking again costs no Redis call)."""
        return PAUSED_PARK_SECONDS if parking else PAUSED_HOLD_SECONDS
