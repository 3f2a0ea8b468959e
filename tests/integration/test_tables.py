"""Every limiter's decision table, on every backend (Python twins and each Redis)."""

from __future__ import annotations

import pytest

from celery_funnel import Funnel
from celery_funnel._limiter.strategies.reservation import Shape
from celery_funnel._limiter.strategies.settle import Settle
from tests.tables import T0, TABLES, answer_row, play, rows

# every script touches only the keys it is given (read from what Redis ran)
pytestmark = pytest.mark.usefixtures("declared_keys_only")


@pytest.mark.parametrize("table", list(TABLES))
def test_table(funnel: Funnel, key: str, table: str) -> None:
    for label, method, kwargs, expected in rows(table):
        assert answer_row(play(funnel, key, method, kwargs)) == expected, label


def test_cell_reply_rounds_partial_seconds_up(funnel: Funnel, key: str) -> None:
    funnel.throttle(key, 4, 1, 1, now=T0)
    decision = funnel.throttle(key, 4, 1, 1, now=T0 + 0.1)
    assert (decision.reset_after, decision.as_cell()) == (1.9, (0, 5, 3, -1, 2))
    for _ in range(3):
        funnel.throttle(key, 4, 1, 1, now=T0 + 0.1)
    refused = funnel.throttle(key, 4, 1, 1, now=T0 + 0.1)
    assert (refused.retry_after, refused.as_cell()) == (0.9, (1, 5, 0, 1, 5))


def test_joint_reservation_table(funnel: Funnel, key: str) -> None:
    """Two funnels, all or nothing. A: limit 1 at 10/s (T 0.1 s); B: limit 2 at 2/s
    (T 0.5 s, tau 1 s). A joint slot is the latest of each funnel's earliest fit, and
    every funnel is charged as if the request arrived then."""
    a, b = f"{{{key}}}:a", f"{{{key}}}:b"
    both = [Shape(a, 0, 10, 1), Shape(b, 1, 2, 1)]

    def joint(offset: float, **kwargs: object) -> tuple[object, ...]:
        return tuple(funnel.reserve_all(both, now=T0 + offset, **kwargs))  # type: ignore[arg-type]

    assert joint(0, max_wait=0) == (True, 0.0, False, 1, 0.5, False)
    assert joint(0, max_wait=0) == (False, 0.1, False, 1, 0.5, False)  # refused, not booked
    assert joint(0.1, max_wait=0) == (True, 0.0, False, 1, 0.9, False)
    assert joint(0.2, ticket="j") == (False, 0.3, True, 1, 1.3, False)  # B binds: slot 0.5
    assert tuple(funnel.throttle(a, 0, 10, 1, now=T0 + 0.2)) == (True, 1, 0, 0.4, 0.4, 0)
    assert joint(0.5, ticket="j", redeem=True) == (True, 0.0, False, 1, 1.0, False)
    never = [Shape(a, 0, 10, 1, 2), Shape(b, 1, 2, 1)]
    assert tuple(funnel.reserve_all(never, now=T0 + 0.5)) == (False, -1.0, False, 1, 1.0, False)


def test_settle_all_table(funnel: Funnel, key: str) -> None:
    """Two funnels settled in one step: A (10/s, T 0.1 s) gives 2 back, B (2/s,
    T 0.5 s) is charged 1 more; each by its own T."""
    a, b = f"{{{key}}}:a", f"{{{key}}}:b"
    funnel.throttle(a, 4, 10, 1, 3, now=T0)  # A: TAT +0.3
    funnel.throttle(b, 1, 2, 1, 1, now=T0)  # B: TAT +0.5
    rows = [Settle(a, 10, 1, -2), Settle(b, 2, 1, 1)]
    assert funnel.settle_all(rows, now=T0) == [0.1, 1.0]
    assert funnel.settle_all([Settle(a, 10, 1, -5), Settle(b, 2, 1, 0)], now=T0 + 0.05) == [
        0.0,
        0.95,
    ]
