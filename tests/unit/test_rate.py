from __future__ import annotations

import math
import pickle
import re
from decimal import Decimal
from fractions import Fraction

import pytest
from celery.utils.time import rate
from hypothesis import assume, given
from hypothesis import strategies as st

from celery_funnel import BackendError, ConfigurationError, FunnelError, Rate, TooManyWaitingError
from celery_funnel._config.options import limits_of
from celery_funnel._config.settings import FunnelSettings
from celery_funnel._shared.overrides import Override


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


# "30/" is 30/s to Celery; here a unit left out is taken for a mistake
@pytest.mark.parametrize(
    "text",
    ["", "30/", "/m", "0/s", "0", "0.0/m", "-1/s", "-1", "3/x", "3/0s", "3/ms", "1.5.5/s",
     "1e3/s", "1/3", "\u0663/s", "0.0000001/d"],
)  # fmt: skip
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


@pytest.mark.parametrize(
    ("value", "named"),
    [(None, "None"), (True, "True"), ([30], "[30]"), (0, "0"), (-5, "-5"), (0.0, "0.0"),
     (float("inf"), "inf"), (float("nan"), "nan")],
)  # fmt: skip
def test_parse_rejects_what_is_not_a_rate(value: object, named: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        Rate.parse(value)  # type: ignore[arg-type]


# Celery's rate_limit forms (celery.utils.time.rate: a bare number is per second, the
# count may be a fraction), each kept exact as a whole count over a period.
CELERY_FORMS = [
    ("5", 5, 1.0, "5/s"),
    (5, 5, 1.0, "5/s"),
    (0.5, 1, 2.0, "1/2s"),
    ("0.5/s", 1, 2.0, "1/2s"),
    ("1.5/m", 3, 120.0, "3/120s"),
    ("100/m", 100, 60.0, "100/m"),
    ("10/h", 10, 3600.0, "10/h"),
    ("2", 2, 1.0, "2/s"),
    (" 2.5 ", 5, 2.0, "5/2s"),
    ("0.25/h", 1, 14400.0, "1/14400s"),
    ("1.50/m", 3, 120.0, "3/120s"),
    ("10.0/s", 10, 1.0, "10/s"),
    ("0.3/1.5s", 3, 15.0, "3/15s"),
    ("30/m", 30, 60.0, "30/m"),
    ("5/2.5s", 5, 2.5, "5/2.5s"),
]


@pytest.mark.parametrize(("given", "count", "period", "text"), CELERY_FORMS)
def test_celery_forms(given: str | float, count: int, period: float, text: str) -> None:
    rate = Rate.parse(given)
    assert (rate.count, rate.period) == (count, period)
    assert str(rate) == text
    assert Rate.parse(str(rate)) == rate  # what the CLI and stored overrides write


@pytest.mark.parametrize(
    "given", ["5", 5, 0.5, "0.5/s", "1.5/m", "100/m", "10/h", "2", "0.25/h", 2.5]
)
def test_same_pace_as_celery(given: str | float) -> None:
    """As many per second as Celery's worker fills its token bucket with
    (``rate(rate_limit)``), on the whole microseconds the strategies run on."""
    parsed = Rate.parse(given)
    period_us = round(parsed.period * 1_000_000)
    assert period_us == parsed.period * 1_000_000  # whole: nothing rounded away
    assert math.isclose(parsed.count * 1_000_000 / period_us, rate(given), rel_tol=1e-15)


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
    [
        FunnelError("x"),
        ConfigurationError("bad rate '0/s'"),
        BackendError("Redis down"),
        TooManyWaitingError(6, 6, "funnel:{app.send}", "app.send"),
    ],
)
def test_exceptions_pickle(error: FunnelError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert isinstance(copy, FunnelError)
    assert vars(copy) == vars(error), "its figures too"


def test_too_many_waiting_names_the_task_its_funnel_and_the_figures() -> None:
    error = TooManyWaitingError(7, 6, "funnel:{app.send}", "app.send")
    assert (error.waiting, error.limit, error.funnel, error.task) == (
        7,
        6,
        "funnel:{app.send}",
        "app.send",
    )
    assert str(error) == (
        "task 'app.send': 7 tasks of its funnel 'funnel:{app.send}' wait to start"
        " (funnel_max_waiting=6): send again once they have"
    )
    assert str(TooManyWaitingError(1, 1, "funnel:{app.send}", "app.send")) == (
        "task 'app.send': 1 task of its funnel 'funnel:{app.send}' waits to start"
        " (funnel_max_waiting=1): send again once it has"
    )


@given(
    st.decimals(min_value=Decimal("0.001"), max_value=Decimal("100000"), places=3),
    st.sampled_from("smhd"),
)
def test_fractional_counts_stay_exact(count: Decimal, unit: str) -> None:
    rate = Rate.parse(f"{count}/{unit}")
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    assert Fraction(rate.count) / Fraction(rate.period) == Fraction(count) / seconds
    assert Rate.parse(str(rate)) == rate


class _Numbers:
    funnel_rate = 5
    funnel_capacity = 1
    funnel_strategy = "gcra"
    funnel_key = None
    funnel_cost = 1
    funnel_limits = ({"rate": "0.5/s"}, "1.5/m", 2)


def test_every_place_a_rate_is_given_reads_celery_forms() -> None:
    """``funnel_rate``, entries of a task's ``funnel_limits``, of the ``funnel_limits``
    setting, and overrides (``celery funnel set NAME RATE``, the dashboard)."""
    assert [limit.rate for limit in limits_of(_Numbers)] == [
        Rate(5, 1), Rate(1, 2), Rate(3, 120), Rate(2, 1)
    ]  # fmt: skip
    conf = {"funnel_limits": {"a.*": "2", "b.*": 0.5, "c.*": {"rate": "1.5/m", "capacity": 2}}}
    settings = FunnelSettings.from_conf(conf)
    assert [limit.rate for limit in settings.limits] == [Rate(2, 1), Rate(1, 2), Rate(3, 120)]
    assert Override.checked("0.5/s", None, None).rate == Rate(1, 2)
    assert Override.checked(5, None, None).rate == Rate(5, 1)
    stored = Override.checked("1.5/m", None, None)
    assert Override.from_json(stored.to_json()) == stored  # what every worker reads back


@pytest.mark.parametrize(
    "conf",
    [{"funnel_limits": {"a.*": "2/x"}}, {"funnel_limits": {"a.*": {"rate": -1}}}],
)
def test_a_bad_rate_in_settings_is_named(conf: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match=r"funnel_limits\['a\.\*'\].*rate"):
        FunnelSettings.from_conf(conf)
