"""``Funnel``: the public API of every backend, implemented once over ``_eval``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..decision import Decision, Reservation
from ..guard import limit_method
from ..rate import Rate
from ..scripts import Arg, Call, Op, Reply, Script
from ..strategies import fixed_window, gcra, sliding_log, sliding_window
from ..strategies._common import US
from ..strategies.adapt import REFUSED, SUCCEEDED, Adaptive, AdaptOp
from ..strategies.align import Align, AlignOp
from ..strategies.gcra import ThrottleOp
from ..strategies.hold import HoldOp
from ..strategies.reservation import ReserveOp, Shape
from ..strategies.settle import Settle, SettleOp

T = TypeVar("T")


class Funnel(ABC):
    """A store of funnels. Each method is one atomic call on one funnel (one round trip
    on Redis); ``decide`` runs any list of operations (``ThrottleOp``, ``ReserveOp``,
    ``SettleOp``, ``AlignOp``, ``HoldOp``, ``AdaptOp``...) in one round trip, and the
    batch methods (``throttle_many``, ``reserve_all``, ``settle_all``, ``align_all``) are
    it for one kind. Times are float seconds; ``now`` (seconds since the epoch) replaces the
    store's clock, for tests and replays: without it the Redis server's ``TIME`` rules.

    Every method raises ``ConfigurationError`` for a zero or negative count or period,
    a negative max_burst or quantity, or an empty key, before reaching the store, and
    ``BackendError`` when the store fails (an outage: unreachable, timing out, loading,
    failing over), ``BackendConfigurationError`` when it refuses the work as configured
    (wrong password, NOPERM, read-only replica, OOM, WRONGTYPE).
    """

    @abstractmethod
    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        """Run ``script`` atomically on ``keys`` with ``args``."""

    def _eval_many(self, calls: Sequence[Call]) -> list[Reply]:
        """Run each call atomically, in order; one round trip where the store allows."""
        return [self._eval(*call) for call in calls]

    def decide(self, ops: Sequence[Op[T]]) -> list[T]:
        """Run ``ops`` (each one atomic script call: a ``scripts.Op``) in one round trip
        (one pipeline on Redis; not all or nothing: each op is atomic on its own), and
        answer each, in order. Every op's arguments are checked before anything is sent:
        a bad one raises ``ConfigurationError`` and nothing is decided."""
        if len(ops) == 1:
            op = ops[0]
            return [op.answer(self._eval(*op.call()))]
        calls = [op.call() for op in ops]
        replies = self._eval_many(calls) if calls else []
        return [op.answer(reply) for op, reply in zip(ops, replies, strict=True)]

    def _decide_in_order(
        self, decisions: Sequence[Callable[[Funnel], T]], admits: Callable[[T], bool]
    ) -> list[T]:
        """Run ``decisions`` (each one decision on this store) in order until one does not
        ``admit``; their answers. One round trip where the store allows (RedisFunnel)."""
        answers: list[T] = []
        for decision in decisions:
            answers.append(decision(self))
            if not admits(answers[-1]):
                break
        return answers

    def throttle(
        self,
        key: str,
        max_burst: int,
        count: int,
        period: float,
        quantity: int = 1,
        *,
        now: float | None = None,
    ) -> Decision:
        """Take ``quantity`` units from the GCRA funnel ``key``, as ``CL.THROTTLE`` does.

        The funnel holds ``max_burst + 1`` units and refills ``count`` units per
        ``period`` seconds. ``quantity=0`` peeks without taking anything; a quantity
        above the limit is refused with ``retry_after == -1.0``.
        """
        return gcra.throttle(self._eval, key, max_burst, count, period, quantity, now)

    def throttle_many(
        self, funnels: Sequence[Shape], *, now: float | None = None
    ) -> list[Decision]:
        """``throttle`` on many GCRA funnels in one round trip (one pipeline on Redis):
        one ``Decision`` per ``Shape`` (key, max_burst, count, period, quantity), in
        order. Each decision is atomic on its own funnel, as ``throttle`` is; the batch
        is not all or nothing (``reserve_all`` is). Arguments are checked before anything
        is sent: a bad one raises ``ConfigurationError`` and nothing is decided.
        """
        return self.decide(
            [ThrottleOp(f.key, f.max_burst, f.count, f.period, f.quantity, now) for f in funnels]
        )

    def water_level(
        self,
        key: str,
        capacity: int,
        count: int,
        period: float,
        quantity: int = 1,
        *,
        now: float | None = None,
    ) -> Decision:
        """Seed 003's water-level bucket: admit while ``water + quantity <= capacity``,
        the water leaking at ``count / period`` units per second.

        Computed exactly, it is the GCRA funnel with ``max_burst = capacity - 1`` (the
        water level is ``TAT - now`` in units of T), so this is ``throttle``.
        """
        return self.throttle(key, capacity - 1, count, period, quantity, now=now)

    def reserve(
        self,
        key: str,
        max_burst: int,
        count: int,
        period: float,
        quantity: int = 1,
        *,
        ticket: str | None = None,
        redeem: bool = False,
        max_wait: float | None = None,
        early: float | None = None,
        late: float | None = None,
        now: float | None = None,
        rank: int | None = None,
    ) -> Reservation:
        """Take ``quantity`` units from the GCRA funnel ``key`` now, or book the next
        slot where they fit and return the delay until it.

        ``ticket`` names the booking so that a later call with ``redeem=True`` can use
        it: admitted once, from ``early`` seconds before the slot (default: one slot's
        width, at most 0.05 s) until ``late`` seconds after it (default: one slot's
        width, ``quantity * period / count``); before that it is told the remaining
        delay, after it the ticket is dropped and a new slot is booked. ``max_wait``
        (seconds) refuses to book further ahead than that. ``rank`` (0 most urgent ..
        255, None for none) is the booking's priority: a ticket takes the earliest future
        slot booked by a less urgent ticket instead of the tail; the displaced ticket,
        when redeemed, books anew at the tail.

        Raises:
            ConfigurationError: for an argument out of range (nothing is sent).
        """
        return self.reserve_all(
            [Shape(key, max_burst, count, period, quantity)],
            ticket=ticket, redeem=redeem, max_wait=max_wait, early=early, late=late, now=now,
            rank=rank,
        )  # fmt: skip

    def reserve_all(
        self,
        funnels: Sequence[Shape],
        *,
        ticket: str | None = None,
        redeem: bool = False,
        max_wait: float | None = None,
        early: float | None = None,
        late: float | None = None,
        now: float | None = None,
        rank: int | None = None,
    ) -> Reservation:
        """``reserve`` across several GCRA funnels at once, all or nothing: the slot is
        the earliest time at which every funnel admits its ``Shape``'s quantity, and
        each funnel is charged as if the request arrived then. ``max_wait=0`` admits now
        or refuses without booking. The keys must share one Redis Cluster hash slot;
        the tickets live beside the first. ``limit`` in the answer is the first funnel's.
        ``rank`` displaces less urgent tickets with one funnel only (a joint booking's
        slot is where every funnel admits: no single ticket's slot is one).
        """
        op = ReserveOp(funnels, ticket, redeem, max_wait, early, late, now, rank)
        return self.decide([op])[0]

    def hold(
        self,
        key: str,
        max_burst: int,
        count: int,
        period: float,
        seconds: float,
        *,
        now: float | None = None,
    ) -> float:
        """Admit nothing on GCRA funnel ``key`` until ``seconds`` from now, for every
        caller: the next unit fits exactly then. Booked tickets are voided (their
        holders book again). For an upstream's 429 with Retry-After. Returns the seconds
        until the funnel is idle again."""
        return self.decide([HoldOp(key, max_burst, count, period, seconds, now)])[0]

    def settle(
        self, key: str, count: float, period: float, units: int, *, now: float | None = None
    ) -> float:
        """Charge ``units`` more on GCRA funnel ``key`` (refilling ``count`` per
        ``period`` seconds), or give ``-units`` back, at once for every caller: a run
        charged an estimate settles what it used (``units = actual - charged``). A
        give-back stops at an idle funnel. Returns the seconds until it is idle."""
        return self.settle_all([Settle(key, count, period, units)], now=now)[0]

    def settle_all(self, funnels: Sequence[Settle], *, now: float | None = None) -> list[float]:
        """``settle`` on several GCRA funnels in one atomic call (one round trip); the
        keys must share one Redis Cluster hash slot. Per funnel, seconds until idle."""
        return self.decide([SettleOp(funnels, now)])[0] if funnels else []

    def align(
        self,
        key: str,
        max_burst: int,
        count: float,
        period: float,
        remaining: int,
        reset: float = 0.0,
        *,
        window: bool = False,
        now: float | None = None,
    ) -> float:
        """Bring GCRA funnel ``key`` in line with an upstream that says ``remaining``
        units remain of its limit: it admits at most that many now (a bucket), or
        before ``reset`` seconds from now (``window=True``). The funnel is never made
        more generous. Returns the seconds until it is idle."""
        row = Align(key, max_burst, count, period, remaining, reset, window)
        return self.align_all([row], now=now)[0]

    def align_all(self, funnels: Sequence[Align], *, now: float | None = None) -> list[float]:
        """``align`` on several GCRA funnels in one atomic call (one round trip); the
        keys must share one Redis Cluster hash slot. Per funnel, seconds until idle."""
        return self.decide([AlignOp(funnels, now)])[0] if funnels else []

    def adapt(
        self,
        key: str,
        field: str,
        *,
        refused: bool,
        adaptive: Adaptive,
        rate: Rate,
        now: float | None = None,
    ) -> tuple[float, bool]:
        """Record a refusal (an upstream's 429) or a success on the adaptive rate of
        funnel ``field`` (a limit of code rate ``rate``), kept in hash ``key``: see
        ``strategies.adapt``. Returns the seconds per unit now in force and whether
        this call changed them."""
        event = REFUSED if refused else SUCCEEDED
        us, changed = self.decide([AdaptOp(key, field, adaptive, rate, event, now)])[0]
        return us / US, changed

    def fixed_window(
        self,
        key: str,
        limit: int,
        period: float,
        quantity: int = 1,
        *,
        partial: bool = False,
        now: float | None = None,
    ) -> Decision:
        """At most ``limit`` units per ``period``-second window aligned on the epoch.

        With ``partial=True`` a request that does not fit whole is granted what is
        left (``Decision.granted``), as seed 004's ``acquire`` does.
        """
        return fixed_window.fixed_window(self._eval, key, limit, period, quantity, partial, now)

    def sliding_log(
        self,
        key: str,
        limit: int,
        period: float,
        quantity: int = 1,
        *,
        now: float | None = None,
    ) -> Decision:
        """At most ``limit`` units in any ``period`` seconds, by a log of each unit."""
        return sliding_log.sliding_log(self._eval, key, limit, period, quantity, now)

    def sliding_window(
        self,
        key: str,
        limit: int,
        period: float,
        quantity: int = 1,
        *,
        windows: int = 10,
        partial: bool = False,
        now: float | None = None,
    ) -> Decision:
        """At most ``limit`` units in the last ``windows`` sub-windows of
        ``period / windows`` seconds each (the current one included)."""
        return sliding_window.sliding_window(
            self._eval, key, limit, period, quantity, windows, partial, now
        )

    limit = limit_method

    @abstractmethod
    def reset(self, key: str) -> None:
        """Forget funnel ``key`` and everything kept beside it (tickets, counters)."""
