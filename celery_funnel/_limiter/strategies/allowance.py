"""A worker's allowance on a GCRA funnel: ``k`` units taken in one call and spent by
the worker itself, without a call per run, while the funnel is far from full.

``allowance.lua`` is the head of ``reserve.lua``'s call on one funnel: when the funnel,
charged ``k`` units at once, still has at least half its tolerance free (its TAT at
most ``tau / 2`` ahead of now), it takes them and answers ``{0, 0, reset_after, 0,
k}``; otherwise it takes nothing and reserve.lua's own decision follows, for one unit,
exactly as without an allowance (admitted, booked, refused). So near full every run is
decided on its own, as before.

The units are charged when taken; the worker spends them for ``SECONDS`` at most from
the moment it asked, then drops what is left (units lost, never runs). A unit is spent
at most ``SECONDS`` after it was charged: in any window of ``w`` seconds, runs start
at most ``rate x w + capacity + k x workers`` times (``k`` from ``units``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..memstore import MemoryStore
from ..rate import Rate
from ..scripts import Arg, Call, Reply, Script, parse_now, source
from . import reservation
from .reservation import ADMITTED, ReserveOp, Shape

__all__ = ["MOST", "SCRIPT", "SECONDS", "AllowanceOp", "Taken", "call", "taken", "units"]

SECONDS = 0.05  # how long a worker may spend units it took (from when it asked)
MOST = 64  # the most units taken in one call
UNITS_ARG = 10  # the index of k in the call's arguments (ARGV[11])


def units(rate: Rate, capacity: int) -> int:
    """``k``, the units a worker asks for at once on a funnel of ``rate`` and
    ``capacity``: what the rate lets through in ``SECONDS``, at most ``MOST`` and half
    the capacity (more could never be taken). 1 or less: no allowance."""
    return min(MOST, math.floor(rate.count / rate.period * SECONDS), capacity // 2)


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    k = int(argv[UNITS_ARG]) if len(argv) > UNITS_ARG else 0
    if k > 1 and len(keys) == 3 and str(argv[2]) != "1":
        now = parse_now(argv[0], store)
        tat = max(int(store.get(keys[2]) or now), now)
        after = tat + k * int(argv[7])
        if (after - now) * 2 <= int(argv[8]):
            store.set_px(keys[2], str(after), -(-(after - now) // 1000))
            return [ADMITTED, 0, after - now, 0, k]
    return reservation.SCRIPT.twin(store, keys, argv)  # type: ignore[misc]


# reserve.lua after its head: the clock, then allowance.lua, then reserve.lua's body;
# a reply admits as reserve.lua's does
SCRIPT = dataclasses.replace(
    Script.build(
        "allowance",
        source("_clock", "allowance", "reserve"),
        _twin,
        reservation.SCRIPT.admitted,
        body=source("allowance", "reserve"),
    ),
    admits=reservation.SCRIPT.admits,
)


def call(reserve: Call, k: int) -> Call:
    """``reserve``, the call of one run's reservation on one funnel, asking for ``k``
    units at once instead."""
    _, keys, args = reserve
    return SCRIPT, keys, [*args, k]


def taken(reply: Reply) -> int:
    """The units a reply that admits took: ``k`` (an allowance), or 1 (one run)."""
    return reply[4] if len(reply) > 4 else 1


class Taken(NamedTuple):
    """What one ``AllowanceOp`` answered: ``units`` taken (0: none, the run refused),
    and the reservation's answer for the run (``delay``, ``booked``, ``reset_after``)."""

    units: int
    delay: float
    booked: bool
    reset_after: float


@dataclass(frozen=True)
class AllowanceOp:
    """An allowance of ``k`` units as an operation (``scripts.Op``) on one funnel,
    booked under ``ticket`` when it refuses (``reserve``'s decision)."""

    key: str
    max_burst: int
    count: int
    period: float
    k: int
    ticket: str | None = None
    now: float | None = None

    def call(self) -> Call:
        shape = Shape(self.key, self.max_burst, self.count, self.period)
        return call(ReserveOp([shape], self.ticket, now=self.now).call(), self.k)

    def answer(self, reply: Reply) -> Taken:
        reservation_ = ReserveOp([Shape(self.key, self.max_burst, 1, 1.0)]).answer(reply[:4])
        got = taken(reply) if reservation_.admitted else 0
        return Taken(got, reservation_.delay, reservation_.booked, reservation_.reset_after)
