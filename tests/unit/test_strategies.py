"""The strategy registry, and ``Limit`` checking itself when built, in the user's words."""

from __future__ import annotations

import pytest

from celery_funnel import ConfigurationError, Limit, MemoryFunnel, Rate
from celery_funnel._limiter import strategies

# importing the package registers them; a kind added by the recipe (docs/architecture.md)
# joins them, with a table of its own in tests/tables.py
BUILT_INS = ("gcra", "fixed_window", "sliding_window", "sliding_log")


def test_every_strategy_is_registered_by_name() -> None:
    assert set(BUILT_INS) <= set(strategies.names())
    assert [strategies.get(name).name for name in strategies.names()] == list(strategies.names())


def test_an_unknown_strategy_fails_with_the_choices() -> None:
    with pytest.raises(ConfigurationError, match=r"'fixed-window'.*choose one of.*'gcra'") as err:
        Limit(Rate.parse("5/s"), strategy="fixed-window")
    assert "did you mean 'fixed_window'" in str(err.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"capacity": 0}, "capacity must be an integer >= 1, got 0"),
        ({"capacity": 2, "cost": 3}, "cost 3 is above the capacity 2"),
        ({"strategy": "fixed_window", "cost": 6}, "cost 6 is above the rate's count 5"),
        ({"scope": "worker"}, "worker-wide limits (funnel_limits) only"),
        ({"scope": "node", "pattern": "*"}, "scope must be one of"),
        ({"strategy": "sliding_window", "windows": 101}, "windows must be at most 100"),
        ({"capacity": 10**12}, "capacity 1000000000000 at 5/s spans more than"),
        ({"key": 3}, "key must be a format string or a callable"),
    ],
)
def test_a_limit_checks_itself_when_built(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Limit(Rate.parse("5/s"), **options)  # type: ignore[arg-type]


def test_no_message_speaks_of_max_burst() -> None:
    for capacity in (0, -1, 10**12, True):
        with pytest.raises(ConfigurationError) as err:
            Limit(Rate.parse("5/s"), capacity=capacity)
        assert "max_burst" not in str(err.value)


@pytest.mark.parametrize("name", BUILT_INS)
def test_each_built_in_strategy_decides_through_the_registry(name: str) -> None:
    """2/s at capacity 2: each built-in admits two back to back from idle (GCRA by its
    capacity, the windows by the rate's count), not a third."""
    limit = Limit(Rate.parse("2/s"), capacity=2, strategy=name)
    funnel = MemoryFunnel(clock=lambda: 1000.0)
    assert [limit.check(funnel, "k", 1).run for _ in range(3)] == [True, True, False]
    peek = strategies.get(name).decide(funnel, "k", limit, 0)
    assert peek.remaining == 0
