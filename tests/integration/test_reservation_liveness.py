"""Callers that always come back later than their ticket's window: with a fixed late
grace they re-book behind each other for ever; doubling it on each stale return (what
the Celery layer does) lets every one of them start."""

from __future__ import annotations

import uuid

import pytest

from celery_funnel import Funnel
from tests.tables import T0

US = 1_000_000


def _simulate(funnel: Funnel, escalate: bool, callers: int = 10, lateness: int = 350_000) -> int:
    """How many of ``callers`` start; each comes back ``lateness`` us after its slot."""
    key = uuid.uuid4().hex
    pending = [(0, f"task-{i}", -1) for i in range(callers)]  # (time, ticket, times stale)
    started = 0
    for _ in range(400):
        if not pending:
            break
        pending.sort()
        when, ticket, stale = pending.pop(0)
        late = 100_000 * (2 ** max(stale, 0) if escalate else 1)
        answer = funnel.reserve(
            key, 0, 10, 1, ticket=ticket, redeem=stale >= 0, late=late / US,
            now=(T0 * US + when) / US,
        )  # fmt: skip
        if answer.admitted:
            started += 1
            continue
        went_stale = stale >= 0 and lateness > late
        pending.append(
            (when + round(answer.delay * US) + lateness, ticket, max(stale, 0) + went_stale)
        )
    return started


@pytest.mark.parametrize(("escalate", "started"), [(False, 1), (True, 10)])
def test_late_callers_start_only_with_a_widening_grace(
    funnel: Funnel, escalate: bool, started: int
) -> None:
    assert _simulate(funnel, escalate) == started
