"""Hold a GCRA funnel: admit nothing until ``now + seconds``, for every worker.

For an upstream that refused the caller (an HTTP 429 with Retry-After): the funnel's
TAT moves so that the next unit fits exactly at the end of the hold, and booked tickets
are voided so that their holders book again after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigurationError
from ..keys import tickets_key
from ..memstore import MemoryStore
from ..scripts import Arg, Call, Reply, Script, clock_arg, parse_now
from ._common import US, check_key, now_us, seconds
from .gcra import shape


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    t, tau, hold = int(argv[0]), int(argv[1]), int(argv[2])
    now = parse_now(argv[3], store)
    stored = store.get(keys[0])
    tat = min(max(int(stored) if stored is not None else now, now), now + tau)
    tat = max(tat, now + hold + tau - t)
    store.set_px(keys[0], str(tat), -(-(tat - now) // 1000))
    store.delete(keys[1])
    return [tat - now]


SCRIPT = Script.load("hold", _twin)


@dataclass(frozen=True)
class HoldOp:
    """``Funnel.hold`` as an operation (``scripts.Op``): hold funnel ``key`` for
    ``seconds``; answers the seconds until it is idle."""

    key: str
    max_burst: int
    count: int
    period: float
    seconds: float
    now: float | None = None

    def call(self) -> Call:
        check_key(self.key)
        hold_for = self.seconds
        if (
            isinstance(hold_for, bool)
            or not isinstance(hold_for, (int, float))
            or not 0 < hold_for < 1e9
        ):
            raise ConfigurationError(f"hold must be a positive number of seconds, got {hold_for!r}")
        _, t, tau = shape(self.max_burst, self.count, self.period)
        return (
            SCRIPT,
            (self.key, tickets_key(self.key)),
            (t, tau, max(round(hold_for * US), 1), clock_arg(now_us(self.now))),
        )

    def answer(self, reply: Reply) -> float:
        (us,) = reply
        return seconds(us)
