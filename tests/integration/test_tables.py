"""Every limiter's decision table, on every backend (Python twins and each Redis)."""

from __future__ import annotations

import pytest

from celery_funnel import Funnel
from tests.tables import T0, TABLES, Step


@pytest.mark.parametrize("table", list(TABLES))
def test_table(funnel: Funnel, key: str, table: str) -> None:
    steps: list[Step] = TABLES[table]
    for number, (offset, method, kwargs, expected) in enumerate(steps):
        answer = getattr(funnel, method)(key, **kwargs, now=T0 + offset)
        got = tuple(answer) if isinstance(answer, tuple) else (answer,)
        assert got == expected, f"{table} step {number}: {method}({kwargs}) at +{offset}s"


def test_cell_reply_rounds_partial_seconds_up(funnel: Funnel, key: str) -> None:
    funnel.throttle(key, 4, 1, 1, now=T0)
    decision = funnel.throttle(key, 4, 1, 1, now=T0 + 0.1)
    assert (decision.reset_after, decision.as_cell()) == (1.9, (0, 5, 3, -1, 2))
    for _ in range(3):
        funnel.throttle(key, 4, 1, 1, now=T0 + 0.1)
    refused = funnel.throttle(key, 4, 1, 1, now=T0 + 0.1)
    assert (refused.retry_after, refused.as_cell()) == (0.9, (1, 5, 0, 1, 5))
