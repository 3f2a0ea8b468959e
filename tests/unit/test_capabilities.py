"""The strategies' capabilities: one literal table, asked by capability, never by name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from celery_funnel._limiter import strategies
from celery_funnel._limiter.decision import Decision
from celery_funnel._limiter.errors import ConfigurationError
from celery_funnel._limiter.strategies import CAPABILITIES, Capabilities, Strategy, capabilities

PACKAGE = Path(strategies.__file__).resolve().parents[2]
# a strategy's name compared with a string: what capabilities() replaces
NAME_TEST = re.compile(r"""(strategy\b[^\n]{0,40}(==|!=|\bin\b)\s*[("']|or "gcra"\)\s*[!=]=)""")


def test_every_registered_strategy_has_its_row() -> None:
    assert set(strategies.names()) <= set(CAPABILITIES)
    for name in strategies.names():
        strategy = strategies.get(name)
        assert strategy.can is CAPABILITIES[name]
        assert strategy.can.books == (strategy.reserve is not None)


def test_an_unknown_name_can_nothing() -> None:
    assert capabilities("no-such") == Capabilities()
    assert capabilities(None) == Capabilities()


def test_register_takes_a_new_strategys_row_and_checks_it() -> None:
    def decide(funnel: Any, key: str, spec: Any, quantity: int) -> Decision:
        raise NotImplementedError

    with pytest.raises(ConfigurationError, match="books a slot iff it has reserve"):
        strategies.register(Strategy("toy_books", decide=decide), Capabilities(books=True))
    assert "toy_books" not in CAPABILITIES  # refused: no row left behind
    try:
        can = Capabilities(capacity_bound=True)
        strategies.register(Strategy("toy_kind", decide=decide), can)
        assert capabilities("toy_kind") is can
    finally:
        strategies._registry._REGISTRY.pop("toy_kind", None)
        CAPABILITIES.pop("toy_kind", None)
        CAPABILITIES.pop("toy_books", None)


def test_no_code_outside_the_strategies_tests_a_strategy_by_name() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "strategies" in path.parts:
            continue
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if NAME_TEST.search(line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not found, found
