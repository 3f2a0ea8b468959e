"""A decision written once, run awaited: ``awaited`` runs any decision written over a
``Funnel`` (its methods, a limit's check) with its script calls sent by a coroutine.

A decision runs against ``KnownReplies``, a store that answers its script calls from the
replies known so far and stops it (``Needs``) at the first call not answered yet; the
coroutine sends that call (or batch: ``decide``), and the decision runs again from its
start with one more reply known. Arguments are built and replies decoded by the strategies,
as on every other store; only the round trip is awaited.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn, TypeVar

from ..scripts import Arg, Call, Reply, Script
from .base import Funnel

__all__ = ["KnownReplies", "Needs", "awaited"]

T = TypeVar("T")
RunMany = Callable[[Sequence[Call]], Awaitable[list[Reply]]]


class Needs(BaseException):
    """A decision needs the replies to ``calls``. A BaseException, so that no ``except
    Exception`` in a decision mistakes it for a failure."""

    def __init__(self, calls: Sequence[Call]) -> None:
        super().__init__()
        self.calls = calls

    def __str__(self) -> str:  # built only when shown: one is raised per decision
        return ", ".join(call[0].name for call in self.calls)


class KnownReplies(Funnel):
    """A store whose script calls are answered, batch by batch, from ``replies``."""

    def __init__(self, replies: Sequence[list[Reply]]) -> None:
        self._replies = iter(replies)

    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        return self._eval_many([(script, keys, args)])[0]

    def _eval_many(self, calls: Sequence[Call]) -> list[Reply]:
        known = next(self._replies, None)
        if known is None:
            raise Needs(calls)
        return known

    def reset(self, key: str) -> NoReturn:
        raise NotImplementedError("reset is a store's own command, not a script")


async def awaited(decision: Callable[[Funnel], T], run_many: RunMany) -> T:
    """What ``decision`` answers on a store whose script calls ``run_many`` sends (one
    round trip per call or batch the decision makes; a decision makes one)."""
    known: list[list[Reply]] = []
    while True:
        try:
            return decision(KnownReplies(known))
        except Needs as needs:
            known.append(await run_many(needs.calls))
