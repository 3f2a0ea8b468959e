"""A worker's allowances (``Allowances``): units of a fast funnel taken in one call
(``_limiter.strategies.allowance``) and spent here, one per run, without a call each,
while the funnel is far from full.

Only for the simple, common run (``wanted``): one GCRA funnel of cost 1, booked where
refused (``funnel_reservation``), no fair share, no adaptive rate, no override or
pause in the live table, a first arrival with no booking, no expiry; the units asked
for (``units``: the rate's worth in ``SECONDS``, at most ``MOST`` and half the capacity)
more than one; a funnel the worker decides densely (a run of it started or decided
within ``SECONDS`` before). Any other run is decided as before, alone. Within that
bound a worker asks for what it spent in its last allowance's time (doubled when it
spent them all): units it would not spend are not taken from the other workers.

A unit is spent at most once (under a lock: the gate may be entered from more than one
thread) and at most ``SECONDS`` after the call that took it went out: later, what is
left is dropped (units lost, never runs: the funnel charged them). An override or a
pause of the funnel drops its units at the next run that would spend one. A worker
killed with units left loses only those units.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from .._config.runtime import Runtime
from .._limiter.scripts import Call
from .._limiter.strategies import allowance, reservation
from .._shared.charges import Charge
from .._shared.live import Live
from .arrival import Arrival

__all__ = ["Allowances", "Keep"]

KEYS = 1024  # more funnel keys taken from than this: those past their time are forgotten
Keep = Callable[[Any], None]  # told the reply (or error) of a call that asked for units
Allowance = tuple[int, float, int]  # units left, the monotonic time past which none is
# spent, and how many were taken at first


class Allowances:
    """The units this worker took and has yet to spend, per funnel key, for
    ``runtime``'s funnels under ``live``'s table."""

    def __init__(self, runtime: Runtime, live: Live) -> None:
        self.runtime, self.live = runtime, live
        self.taken: dict[str, Allowance] = {}
        # the units to ask for next, per funnel key: what the worker spent in its last
        # allowance's time, doubled when it spent them all (few units lost at a worker
        # that starts few runs of the funnel)
        self.sizes: dict[str, int] = {}
        self.lock = threading.Lock()
        self.loaded = False  # whether allowance.lua was loaded on the funnels' Redis
        # per funnel key, when this worker's one call asking for units went, and when
        # it last decided a run (monotonic)
        self.asking: dict[str, float] = {}
        self.decided: dict[str, float] = {}

    def _charge(self, arrival: Arrival) -> Charge | None:
        """The one charge of a run an allowance may pay (None: decided alone)."""
        charges, state, subject = arrival.charges, arrival.state, arrival.subject
        if len(charges) != 1 or state.deferrals or state.booked or state.passed:
            return None
        charge = charges[0]
        limit = charge.limit
        if charge.cost != 1 or charge.fair is not None or limit.adaptive is not None:
            return None
        if subject.expires_in is not None or subject.dry_run or limit.name is not None:
            return None
        return charge

    def spend(self, arrival: Arrival) -> bool:
        """Spend one unit on ``arrival``'s run: whether it is paid for."""
        if not self.taken:  # the common case when nothing is taken: one look
            return False
        charge = self._charge(arrival)
        if charge is None:
            return False
        overridden = self.live.overrides.get(charge.label) is not None
        with self.lock:
            units, until, first = self.taken.pop(charge.key, (0, 0.0, 0))
            if overridden or units < 1:
                return False  # dropped: overridden or paused
            now = time.monotonic()
            if now >= until:  # dropped: next time, ask for what was spent
                self.sizes[charge.key] = max(2, first - units + 1)
                return False
            self.decided[charge.key] = now
            if units > 1:
                self.taken[charge.key] = (units - 1, until, first)
            else:  # all spent in time: ask for more next time
                self.sizes[charge.key] = min(allowance.MOST, 2 * (first + 1))
        return True

    def wanted(
        self, arrival: Arrival, charges: Sequence[Charge], call: Call
    ) -> tuple[Call, Keep | None]:
        """The call of ``arrival``'s decision (``call``: its reservation; ``charges``:
        under the live table), asking for an allowance where one may be taken, and
        what keeps the units its reply takes (None: it asks for none)."""
        if not self.runtime.settings.allowance:
            return call, None
        charge = self._charge(arrival)
        if charge is None:
            return call, None
        if call[0] is not reservation.SCRIPT or len(call[1]) != 3 or charges[0] is not charge:
            return call, None  # not one funnel's reservation, or overridden
        if self.live.overrides.get(charge.label) is not None:
            return call, None
        k = allowance.units(charge.limit.rate, charge.limit.capacity)
        now = time.monotonic()
        if k <= 1 or not self._dense(charge.key, now):
            return call, None
        if self.asking.get(charge.key, -allowance.SECONDS) > now - allowance.SECONDS:
            return call, None  # none, or one call asks already (its units would be late)
        if not self._load():
            return call, None
        self.asking[charge.key] = now
        k = min(k, self.sizes.get(charge.key, k))
        return allowance.call(call, k), partial(self.keep, charge.key, now)

    def _dense(self, key: str, now: float) -> bool:
        """Whether this worker started or decided a run of ``key`` within ``SECONDS``
        before ``now`` (monotonic), and records this one. A funnel a worker decides
        sparsely takes no units: few would be spent, and a run decided alone sees a
        hold (``funnel_backoff``) its previous run set."""
        last = self.decided.get(key)
        self.decided[key] = now
        if len(self.decided) > KEYS:
            since = now - allowance.SECONDS
            self.decided = {k: at for k, at in self.decided.items() if at > since}
        return last is not None and now - last <= allowance.SECONDS

    def _load(self) -> bool:
        """allowance.lua on the funnels' Redis, loaded once (as redis-py's ``Lock``
        registers its scripts; again after a NOSCRIPT reply): whether it is there."""
        if self.loaded:
            return True
        client = getattr(self.runtime.funnel, "client", None)
        try:
            client.script_load(allowance.SCRIPT.source)  # type: ignore[union-attr]
        except (RedisError, OSError, AttributeError):
            return False  # decided alone this time
        self.loaded = True
        return True

    def keep(self, key: str, sent: float, reply: Any) -> None:
        """``reply`` (or error) of the call that asked for units of ``key`` at ``sent``
        (monotonic): the units it took beyond its run's own are kept until ``sent``
        plus ``SECONDS``. A NOSCRIPT error: allowance.lua is loaded again next time."""
        self.asking.pop(key, None)
        if isinstance(reply, NoScriptError):
            self.loaded = False
        extra = allowance.taken(reply) - 1 if isinstance(reply, list) else 0
        if extra < 1:
            return
        until = sent + allowance.SECONDS
        with self.lock:
            units, before, _ = self.taken.get(key, (0, 0.0, 0))
            if units and time.monotonic() < before:  # the older units' time still bounds all
                extra, until = units + extra, min(until, before)
            self.taken[key] = (extra, until, extra)
            if len(self.taken) > KEYS:
                self._sweep()

    def _sweep(self) -> None:
        """Forget the units past their time and the calls asking no more (many funnel
        keys: one per customer, say), and the sizes asked for (under the lock)."""
        now = time.monotonic()
        self.taken = {key: taken for key, taken in self.taken.items() if taken[1] > now}
        self.asking = {k: at for k, at in self.asking.items() if at > now - allowance.SECONDS}
        self.sizes.clear()
