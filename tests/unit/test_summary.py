"""The periodic summary's lines (``_ops.summary.summary_lines``): one per funnel, this
worker's held and republished tasks, the funnel's parked ones, the next due time in
UTC; nothing when nothing waits. The log itself is read from real workers in
tests/integration/test_why.py."""

from __future__ import annotations

from typing import Any

import pytest

from celery_funnel._config.settings import FunnelSettings
from celery_funnel._limiter.errors import ConfigurationError
from celery_funnel._ops.summary import summary_lines


def row(how: str, funnel: str, eta: str | None, name: str = "tasks.call") -> dict[str, Any]:
    return {"id": "x", "name": name, "how": how, "funnel": funnel, "eta": eta}


def test_a_line_per_funnel() -> None:
    rows = [
        row("held", "tasks.call", "2026-11-28T04:01:05+00:00"),
        row("held", "tasks.call", "2026-11-28T05:01:02+01:00"),  # 04:01:02 UTC: the next
        row("republished", "", "2026-11-28T04:03:00+00:00", name="tasks.call"),
        row("held", "limit:tasks.other", None, name="tasks.other"),
    ]
    assert summary_lines(rows, {"tasks.call": 40, "tasks.far": 2}) == [
        "celery-funnel: funnel limit:tasks.other: 1 held in this worker",
        "celery-funnel: funnel tasks.call: 2 held and 1 republished in this worker,"
        " 40 parked; the next due at 04:01:02 UTC",
        "celery-funnel: funnel tasks.far: 2 parked",
    ]


def test_nothing_waits_nothing_is_said() -> None:
    assert summary_lines([], {}) == []


def test_the_period_is_checked() -> None:
    assert FunnelSettings.from_conf({}).log_summary_every == 60.0
    assert FunnelSettings.from_conf({"funnel_log_summary_every": 0}).log_summary_every == 0.0
    with pytest.raises(ConfigurationError, match="funnel_log_summary_every"):
        FunnelSettings.from_conf({"funnel_log_summary_every": -1})
