"""Giving a booked slot back: a task revoked while it waited for its slot will not use
it (``lua/give_back.lua``, with its Python twin for the memory backend)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._limiter.keys import tickets_key
from .._limiter.memstore import MemoryStore
from .._limiter.scripts import Arg, Call, Reply, Script, clock_arg, parse_now
from .._limiter.strategies.gcra import shape

__all__ = ["CancelOp"]


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    now, ticket = parse_now(argv[0], store), str(argv[1])
    slot = store.zscore(keys[0], ticket)
    if slot is None:
        return [0, 0]
    store.zrem(keys[0], ticket)
    given = 0
    for i, key in enumerate(keys[1:]):
        inc, tau = int(argv[2 + 2 * i]), int(argv[3 + 2 * i])
        stored = store.get(key)
        if stored is not None and int(stored) == slot + tau:
            back = int(stored) - inc
            if back > now:
                store.set_px(key, str(back), -(-(back - now) // 1000))
            else:
                store.delete(key)
            given += 1
    return [1, given]


SCRIPT = Script.load("give_back", _twin)


@dataclass(frozen=True)
class CancelOp:
    """Cancel ``ticket``'s booking on the GCRA funnels ``keys`` (each with its
    ``(max_burst, count, period, quantity)``), as one atomic call, run by
    ``Funnel.decide`` (a ``scripts.Op``): the tickets live beside the first key. Answers
    how many funnels took the slot back."""

    keys: Sequence[str]
    shapes: Sequence[tuple[int, int, float, int]]
    ticket: str

    def call(self) -> Call:
        args: list[Arg] = [clock_arg(None), self.ticket]
        for max_burst, count, period, quantity in self.shapes:
            _limit, t, tau = shape(max_burst, count, period)
            args += [t * quantity, tau]
        return SCRIPT, [tickets_key(self.keys[0]), *self.keys], args

    def answer(self, reply: Reply) -> int:
        return int(reply[1])
