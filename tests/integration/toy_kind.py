"""A toy limiter kind, kept outside the package, that follows docs/architecture.md's
"Recipe: add a limiter kind": one module (this one: arguments, reply, twin, the
strategy and its capabilities) and one Lua script (``toy_gap.lua`` beside it).

``toy_gap``: a request of ``q`` units starts only when its funnel is free, and keeps
it busy for ``q`` gaps of ``period / count`` each; more than ``count`` units never fit.
A limit of ``"2/s"`` starts one task every 0.5 s, never two at once (GCRA at capacity 1
would too: the test tells them apart by the funnel's state, a hash here, GCRA's a string).

An in-package kind registers itself when its module is imported (the built-ins do);
this one registers when ``register_kind`` is called (by ``toy_proj``, the worker's
app module, at its import; by the tests' fixture), so that the other tests of a
pytest process never see it among the strategies' choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from celery_funnel._limiter.decision import Decision
from celery_funnel._limiter.memstore import MemoryStore
from celery_funnel._limiter.scripts import Arg, Call, Reply, Script, clock_arg, parse_now
from celery_funnel._limiter.strategies import Capabilities, Strategy, register
from celery_funnel._limiter.strategies._common import (
    check_int,
    check_key,
    emission_us,
    now_us,
    seconds,
)

NAME = "toy_gap"
CAN = Capabilities()  # books nothing, settles nothing: one decision, no more


# 1. The twin: toy_gap.lua's arithmetic in Python, on a MemoryStore (MemoryFunnel runs it).
def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    count, gap, quantity = int(argv[0]), int(argv[1]), int(argv[2])
    now = parse_now(argv[3], store)
    free_at = int(store.hmget(keys[0], ("free",))[0] or 0)
    granted, retry_after = 0, -1
    if 0 < quantity <= count:
        if now >= free_at:
            granted, free_at = quantity, now + quantity * gap
            store.hset(keys[0], {"free": str(free_at)})
            store.pexpire(keys[0], -(-quantity * gap // 1000))
        else:
            retry_after = free_at - now
    return [granted, max(free_at - now, 0), retry_after]


# 2. The script, paired with its twin; ``admitted`` lets a chain of decisions stop here.
SCRIPT = Script.load(
    NAME, _twin, admitted="r[1] >= tonumber(ARGV[3])", directory=Path(__file__).parent
)


# 3. The operation: arguments checked and built (``call``), the reply read (``answer``).
@dataclass(frozen=True)
class ToyGapOp:
    """One toy_gap decision on funnel ``key`` (a ``scripts.Op``: ``Funnel.decide`` runs it)."""

    key: str
    count: int
    period: float
    quantity: int = 1
    now: float | None = None

    def call(self) -> Call:
        check_key(self.key)
        check_int("quantity", self.quantity, 0)
        gap = emission_us(self.count, self.period)  # checks count and period
        return SCRIPT, (self.key,), [self.count, gap, self.quantity, clock_arg(now_us(self.now))]

    def answer(self, reply: Reply) -> Decision:
        granted, busy, retry_us = reply
        return Decision(
            limited=granted < self.quantity,
            limit=self.count,
            remaining=self.count if busy == 0 else 0,
            retry_after=seconds(retry_us),
            reset_after=seconds(busy),
            granted=granted,
        )


# 4. The strategy: how a limit (rate, capacity...) becomes one decision; no Funnel method.
TOY = Strategy(
    NAME,
    decide=lambda funnel, key, spec, quantity: funnel.decide(
        [ToyGapOp(key, spec.rate.count, spec.rate.period, quantity)]
    )[0],
)


def register_kind() -> Strategy:
    """Register ``toy_gap`` with its capabilities (its row of ``CAPABILITIES``)."""
    return register(TOY, can=CAN)
