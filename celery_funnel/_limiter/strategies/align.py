"""Align GCRA funnels with what an upstream says remains (``lua/align.lua``, with its
Python twin): a funnel never admits more than the upstream's ``remaining`` units.

For a bucket (it refills steadily: OpenAI's and Anthropic's headers), the funnel may
take at most ``remaining`` units now: its TAT becomes at least
``now + tau - remaining * T``. For a window (the units come back at once at the reset:
IETF ``RateLimit``), at most ``remaining`` units before the reset, ``reset`` seconds
away: at least ``now + tau + reset - remaining * T``. A TAT is never lowered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigurationError
from ..memstore import MemoryStore
from ..scripts import Arg, Call, Reply, Script, clock_arg, parse_now
from ._common import US, check_key, now_us, seconds
from .gcra import MAX_TOLERANCE_US, shape

__all__ = ["Align", "AlignOp", "align_call"]


@dataclass(frozen=True)
class Align:
    """One GCRA funnel (``key``, ``max_burst``, ``count`` per ``period`` seconds) and
    what the upstream says remains of its limit: ``remaining`` units until ``reset``
    seconds from now, a ``window`` or a bucket."""

    key: str
    max_burst: int
    count: float
    period: float
    remaining: int
    reset: float = 0.0
    window: bool = False


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    now = parse_now(argv[0], store)
    reply: Reply = []
    for i, key in enumerate(keys):
        floor = now + int(argv[1 + i])
        stored = store.get(key)
        tat = max(int(stored) if stored is not None else now, now)
        if floor > tat:
            tat = floor
            store.set_px(key, str(tat), -(-(tat - now) // 1000))
        reply.append(tat - now)
    return reply


SCRIPT = Script.load("align", _twin)


def _floor(row: Align) -> int:
    check_key(row.key)
    _limit, t, tau = shape(row.max_burst, row.count, row.period)
    remaining, reset = row.remaining, row.reset
    if isinstance(remaining, bool) or not isinstance(remaining, int) or remaining < 0:
        raise ConfigurationError(f"remaining must be an integer >= 0, got {remaining!r}")
    if isinstance(reset, bool) or not isinstance(reset, (int, float)) or not 0 <= reset < 1e9:
        raise ConfigurationError(f"reset must be a number of seconds >= 0, got {reset!r}")
    ahead = tau + (round(reset * US) if row.window else 0)
    return min(ahead - min(remaining * t, ahead), MAX_TOLERANCE_US)


def align_call(rows: Sequence[Align], now: float | None) -> Call:
    """The script call aligning every row in one atomic call (arguments checked)."""
    return SCRIPT, [row.key for row in rows], [clock_arg(now_us(now)), *map(_floor, rows)]


@dataclass(frozen=True)
class AlignOp:
    """``Funnel.align_all`` as an operation (``scripts.Op``): every row aligned in one
    atomic call (the keys must share a Cluster hash slot); per row, the seconds until
        its funnel is idle."""

    rows: Sequence[Align]
    now: float | None = None

    def call(self) -> Call:
        return align_call(self.rows, self.now)

    def answer(self, reply: Reply) -> list[float]:
        return [seconds(us) for us in reply]
