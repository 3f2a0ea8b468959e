"""A worker thread's failing pass (the releaser, the live thread) is one log line: an
outage at INFO (the gates say it once at WARNING), a configuration fault at ERROR, the
traceback only under -l DEBUG (it was some 60 lines at INFO), or for an unknown error."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ReadOnlyError

from celery_funnel import BackendConfigurationError, BackendError
from celery_funnel._celery.loop import log_failure


def _raised(error: Exception) -> Exception:
    try:
        raise error
    except Exception as caught:
        return caught


@pytest.mark.parametrize(
    ("error", "level"),
    [
        (BackendError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), "INFO"),
        (ReadOnlyError("You can't write against a read only replica."), "INFO"),
        (BackendConfigurationError("Redis refused the user: fix its ACL"), "ERROR"),
    ],
)
def test_a_known_error_is_one_line(
    caplog: pytest.LogCaptureFixture, error: Exception, level: str
) -> None:
    caplog.set_level(logging.INFO, "celery_funnel")
    log_failure("releasing parked tasks", _raised(error))
    (record,) = caplog.records
    assert (record.levelname, record.exc_info) == (level, None)
    assert len(caplog.text.strip().splitlines()) == 1
    assert record.getMessage() == f"celery-funnel: releasing parked tasks failed: {error}"


def test_the_traceback_shows_under_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "celery_funnel")
    log_failure("live refresh", _raised(BackendError("down")))
    (record,) = caplog.records
    assert record.exc_info is not None
    assert "Traceback" in caplog.text


def test_an_unknown_error_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "celery_funnel")
    log_failure("live refresh", _raised(KeyError("bug")))
    (record,) = caplog.records
    assert (record.levelname, record.exc_info is not None) == ("ERROR", True)
