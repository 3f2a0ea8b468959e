"""``celery funnel why``'s words and times (``_ops.why.Where``), and the setting behind
the INFO wait line (``funnel_log_waits_over``); the behaviour itself is tested on real
workers (tests/integration/test_why.py)."""

from __future__ import annotations

import datetime

import pytest

from celery_funnel._config.settings import FunnelSettings
from celery_funnel._limiter.errors import ConfigurationError
from celery_funnel._ops.why import Where, utc


def test_times_are_utc_iso() -> None:
    assert utc(0) == "1970-01-01T00:00:00.000+00:00"
    assert utc("2026-01-01T01:00:00+01:00") == "2026-01-01T00:00:00.000+00:00"
    naive = datetime.datetime(2026, 1, 1, 12, 0)  # Celery's naive times are UTC
    assert utc(naive) == "2026-01-01T12:00:00.000+00:00"
    assert utc(None) is None


def test_one_to_three_lines_and_one_for_unknown() -> None:
    held = Where(
        "t1", "held", "in worker w1@h by funnel f", task="proj.x", funnel="f",
        eta="2026-01-01T00:00:00.000+00:00", deferrals=2, booked=True, worker="w1@h",
    )  # fmt: skip
    lines = held.lines()
    assert lines[0] == "task proj.x[t1]: held in worker w1@h by funnel f"
    assert 1 <= len(lines) <= 3
    assert "deferrals 2, slot booked" in lines[1]
    assert Where("t2", "unknown", "(nowhere)").lines() == ["task t2: unknown (nowhere)"]
    fields = held.as_dict()
    assert {
        "state",
        "where",
        "funnel",
        "eta",
        "release_at",
        "deferrals",
        "booked",
        "worker",
    } <= set(fields)


def test_log_waits_over_is_checked() -> None:
    assert FunnelSettings.from_conf({}).log_waits_over == 5.0
    assert FunnelSettings.from_conf({"funnel_log_waits_over": 0}).log_waits_over == 0.0
    with pytest.raises(ConfigurationError, match="funnel_log_waits_over"):
        FunnelSettings.from_conf({"funnel_log_waits_over": -1})
