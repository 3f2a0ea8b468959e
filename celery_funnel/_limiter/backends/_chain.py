"""Decisions that cannot share one script (different strategies), in one round trip.

The gate decides such funnels one at a time, in order, stopping at the first that
refuses. Here each decision runs once against a store that only records the script call
it would make; the calls go to Redis as one script (``chain.lua``, each decision
script's own text as a function) that stops where the decisions would have stopped; then
each decision runs again against a store that answers with its reply, so every strategy
decodes its reply as it always does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NoReturn, TypeVar

from ..scripts import Arg, Call, Reply, Script, source
from .base import Funnel

__all__ = ["Capture", "Captured", "Eval", "Replay", "chained"]

T = TypeVar("T")
Eval = Callable[[Script, Sequence[str], Sequence[Arg]], Any]


class Captured(BaseException):
    def __init__(self, call: Call) -> None:
        super().__init__(call[0].name)
        self.call = call


class _Stand(Funnel):
    """A store that stands for a Redis during one decision: decisions in order become the
    one chain script they make, on any keys."""

    def _decide_in_order(
        self, decisions: Sequence[Callable[[Funnel], T]], admits: Callable[[T], bool]
    ) -> list[T]:
        answers = chained(self._eval, decisions, admits, lambda keys: True)
        return answers if answers is not None else super()._decide_in_order(decisions, admits)

    def reset(self, key: str) -> NoReturn:
        raise NotImplementedError


class Capture(_Stand):
    """A store that records the first script call a decision makes, and stops it there
    (``Captured``)."""

    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        raise Captured((script, keys, args))


class Replay(_Stand):
    """A store that answers a decision's first call with ``reply``, and any further call
    through ``fallback`` (a decision of more than one call stays correct)."""

    def __init__(self, reply: Reply | None, fallback: Eval) -> None:
        self.reply: Reply | None = reply
        self.fallback = fallback

    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        reply, self.reply = self.reply, None
        return reply if reply is not None else list(self.fallback(script, keys, args))


@lru_cache(maxsize=64)
def chain_script(scripts: tuple[Script, ...]) -> Script:
    """The one script that runs ``scripts`` in order as ``chain.lua`` does."""
    decisions = ",\n".join(
        f"{{run = function(KEYS, ARGV)\n{script.body}\nend,"
        f" admitted = function(r, ARGV) return {script.admitted} end}}"
        for script in scripts
    )
    text = f"{source('_clock')}local DECISIONS = {{\n{decisions}\n}}\n{source('chain')}"
    # no twin: a chain runs on Redis only; other stores run the decisions
    return Script.build(f"chain({','.join(s.name for s in scripts)})", text)


def _capture(
    decisions: Sequence[Callable[[Funnel], T]], admits: Callable[[T], bool]
) -> list[tuple[Call | None, T | None]]:
    """Each decision's script call, or its answer when it makes none; the decisions after one
    that refuses without Redis are left out (they would never run)."""
    plan: list[tuple[Call | None, T | None]] = []
    for decision in decisions:
        try:
            known = decision(Capture())
        except Captured as captured:
            plan.append((captured.call, None))
            continue
        plan.append((None, known))
        if not admits(known):
            break
    return plan


def chained(
    run: Eval,
    decisions: Sequence[Callable[[Funnel], T]],
    admits: Callable[[T], bool],
    one_slot: Callable[[Sequence[str]], bool],
) -> list[T] | None:
    """The decisions' answers, up to the first that does not admit, from one ``run`` of a
    chain script; None when they cannot be chained (fewer than two script calls, a
    script without an ``admitted`` test, keys over several Cluster slots): the caller
    runs them one by one."""
    plan = _capture(decisions, admits)
    calls = [call for call, _ in plan if call is not None]
    keys = [key for _, call_keys, _ in calls for key in call_keys]
    if len(calls) < 2 or any(s.admitted is None for s, _, _ in calls) or not one_slot(keys):
        return None
    args: list[Arg] = [len(calls)]
    for _, call_keys, call_args in calls:
        args += [len(call_keys), len(call_args)]
    args += [arg for _, _, call_args in calls for arg in call_args]
    replies = iter(run(chain_script(tuple(s for s, _, _ in calls)), keys, args))
    answers: list[T] = []
    for decision, (call, known) in zip(decisions, plan, strict=False):
        if call is None:
            answers.append(known)  # type: ignore[arg-type]  # known is set without a call
        else:
            # a decision the chain did not reach (it stopped earlier than the decisions would
            # have) runs on its own through run: one more round trip, same answer
            answers.append(decision(Replay(next(replies, None), run)))
        if not admits(answers[-1]):
            break
    return answers
