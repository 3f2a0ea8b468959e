from __future__ import annotations

import pickle

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from celery_funnel import BackendError, ConfigurationError, FunnelError, Rate


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [
        ("30/m", 30, 60.0),
        ("10/s", 10, 1.0),
        ("5/h", 5, 3600.0),
        ("1/d", 1, 86400.0),
        ("5/2.5s", 5, 2.5),
        ("100/15m", 100, 900.0),
        (" 7 / .5s ", 7, 0.5),
    ],
)
def test_parse(text: str, count: int, period: float) -> None:
    assert Rate.parse(text) == Rate(count, period)


@pytest.mark.parametrize(
    "text", ["", "30", "30/", "/m", "0/s", "-1/s", "1.5/s", "3/x", "3/0s", "3/ms"]
)
def test_bad_rates_name_the_value(text: str) -> None:
    with pytest.raises(ConfigurationError, match="rate") as info:
        Rate.parse(text)
    assert repr(text) in str(info.value) or text.strip() in str(info.value)


@pytest.mark.parametrize(
    ("count", "period"), [(0, 1), (1, 0), (1, -1), (True, 1), (1, float("inf"))]
)
def test_bad_rate_fields(count: int, period: float) -> None:
    with pytest.raises(ConfigurationError):
        Rate(count, period)


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(ConfigurationError, match="30"):
        Rate.parse(30)  # type: ignore[arg-type]


@given(st.text(max_size=20))
def test_parse_never_fails_otherwise(text: str) -> None:
    """Any string either parses to a valid Rate or raises ConfigurationError."""
    try:
        rate = Rate.parse(text)
    except ConfigurationError:
        return
    assert rate.count >= 1
    assert rate.period > 0


@given(st.integers(1, 10**9), st.sampled_from("smhd"), st.integers(1, 99))
def test_parse_round_trips(count: int, unit: str, multiplier: int) -> None:
    # faster than one unit per microsecond is refused (test_settings_and_limits)
    assume(count <= multiplier * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit] * 10**6)
    rate = Rate.parse(f"{count}/{multiplier}{unit}")
    assert rate == Rate.parse(str(rate))


@pytest.mark.parametrize(
    "error",
    [FunnelError("x"), ConfigurationError("bad rate '0/s'"), BackendError("Redis down")],
)
def test_exceptions_pickle(error: FunnelError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert isinstance(copy, FunnelError)
