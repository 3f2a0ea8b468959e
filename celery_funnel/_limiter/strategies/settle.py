"""Settle a GCRA funnel: a run charged an estimate (``max_tokens``, say) replaces it
with what it really used, and the difference is given back or charged on top, at once,
for every caller (``lua/settle.lua``, with its Python twin for the memory backend).

A give-back never goes below an idle funnel: units charged to a funnel that has since
drained (or whose key expired) are gone already. An extra charge moves the TAT later
by the extra units, past tau if need be: a debt that the next admissions wait out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigurationError
from ..memstore import MemoryStore
from ..scripts import Arg, Call, Reply, Script, clock_arg, parse_now
from ._common import check_key, emission_us, now_us, seconds
from .gcra import MAX_TOLERANCE_US

__all__ = ["Settle", "SettleOp", "decode", "settle_call"]


@dataclass(frozen=True)
class Settle:
    """One funnel to settle: ``units`` (actual - charged; below 0 gives back) of the
    GCRA funnel ``key`` that refills ``count`` units per ``period`` seconds."""

    key: str
    count: float
    period: float
    units: int


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    now, most = parse_now(argv[0], store), int(argv[1])
    reply: Reply = []
    for i, key in enumerate(keys):
        change = int(argv[2 + i])
        stored = store.get(key)
        tat = max(int(stored) if stored is not None else now, now)
        if change:
            tat = min(max(tat + change, now), now + most)
            if tat > now:
                store.set_px(key, str(tat), -(-(tat - now) // 1000))
            else:
                store.delete(key)
        reply.append(tat - now)
    return reply


SCRIPT = Script.load("settle", _twin)


def _change(row: Settle) -> int:
    check_key(row.key)
    units = row.units
    if isinstance(units, bool) or not isinstance(units, int) or abs(units) > MAX_TOLERANCE_US:
        raise ConfigurationError(f"units to settle must be an integer, got {units!r}")
    return emission_us(row.count, row.period) * units


def settle_call(rows: Sequence[Settle], now: float | None) -> Call:
    """The script call settling every row in one atomic call (arguments checked)."""
    changes = [_change(row) for row in rows]
    return SCRIPT, [row.key for row in rows], [clock_arg(now_us(now)), MAX_TOLERANCE_US, *changes]


def decode(reply: Reply) -> list[float]:
    """Per funnel, the seconds until it is idle again."""
    return [seconds(us) for us in reply]


@dataclass(frozen=True)
class SettleOp:
    """``Funnel.settle_all`` as an operation (``scripts.Op``): every row settled in one
    atomic call (the keys must share a Cluster hash slot); per row, the seconds until
        its funnel is idle again."""

    rows: Sequence[Settle]
    now: float | None = None

    def call(self) -> Call:
        return settle_call(self.rows, self.now)

    def answer(self, reply: Reply) -> list[float]:
        return decode(reply)
