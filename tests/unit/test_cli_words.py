"""What the CLI prints: counts agree with their nouns ("1 task", it said "1 tasks"), and
times are UTC wherever it runs (issue 43, item 6)."""

from __future__ import annotations

import time

import pytest

from celery_funnel._limiter.words import plural
from celery_funnel._ops.view import at, utc_time


def test_counts_agree_with_their_nouns() -> None:
    assert [plural(n, "task") for n in (0, 1, 2)] == ["0 tasks", "1 task", "2 tasks"]
    assert plural(1, "parked task") == "1 parked task"
    assert plural(3, "entry", "entries") == "3 entries"


def test_times_are_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert utc_time(0) == "1970-01-01 00:00:00 UTC"
        assert at(90.5, 80.0) == "1970-01-01 00:01:30.500 UTC (in 10.500 s)"
    finally:
        monkeypatch.undo()
        time.tzset()
