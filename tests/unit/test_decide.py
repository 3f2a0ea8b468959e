"""``Funnel.decide``: any list of operations in one round trip, each answered as its own
method would answer."""

from __future__ import annotations

import pytest

from celery_funnel import ConfigurationError, MemoryFunnel, Settle, Shape
from celery_funnel._limiter.scripts import Op
from celery_funnel._limiter.strategies.gcra import ThrottleOp
from celery_funnel._limiter.strategies.hold import HoldOp
from celery_funnel._limiter.strategies.reservation import ReserveOp
from celery_funnel._limiter.strategies.settle import SettleOp

T0 = 1_700_000_000.0


def test_mixed_operations_answer_as_their_methods_do() -> None:
    funnel, methods = MemoryFunnel(), MemoryFunnel()
    ops: list[Op[object]] = [
        ThrottleOp("a", 4, 10, 1, 2, T0),
        ReserveOp([Shape("b", 0, 1, 1)], ticket="t", now=T0),
        ReserveOp([Shape("b", 0, 1, 1)], ticket="u", now=T0),
        SettleOp([Settle("a", 10, 1, 3)], T0),
        HoldOp("c", 0, 1, 1, 5.0, T0),
    ]
    answers = funnel.decide(ops)
    assert answers == [
        methods.throttle("a", 4, 10, 1, 2, now=T0),
        methods.reserve("b", 0, 1, 1, ticket="t", now=T0),
        methods.reserve("b", 0, 1, 1, ticket="u", now=T0),
        methods.settle_all([Settle("a", 10, 1, 3)], now=T0),
        methods.hold("c", 0, 1, 1, 5.0, now=T0),
    ]


def test_nothing_is_decided_when_one_operation_is_bad() -> None:
    funnel = MemoryFunnel()
    with pytest.raises(ConfigurationError):
        funnel.decide([ThrottleOp("a", 0, 1, 1, 1, T0), ThrottleOp("", 0, 1, 1, 1, T0)])
    assert not funnel.throttle("a", 0, 1, 1, now=T0).limited  # the first took nothing


def test_no_operation_decides_nothing() -> None:
    assert MemoryFunnel().decide([]) == []
