"""A ``funnel_limits`` pattern that is no non-empty string stops a real worker at start,
named (issue 28): bytes or a number used to start the worker and then fail every task
in the gate, None was ignored (its tasks ran unlimited)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_config_errors import make_app, refused_start, worker_start_error

pytestmark = pytest.mark.redis

BAD = [
    (b"cfg.*", "funnel_limits: pattern b'cfg.*' is not a string (bytes)"),
    (5, "funnel_limits: pattern 5 is not a string (int)"),
    (None, "funnel_limits: pattern None is not a string (NoneType)"),
    ("", "funnel_limits: pattern '' is empty"),
]


@pytest.mark.parametrize(("pattern", "named"), BAD, ids=["bytes", "int", "None", "empty"])
def test_an_in_process_worker_refuses_a_bad_pattern(
    standalone_url: str, pattern: object, named: str
) -> None:
    app = make_app(standalone_url, funnel_redis_url=standalone_url, funnel_limits={pattern: "5/s"})
    message = worker_start_error(app)
    assert message.startswith(named), message
    assert "\n" not in message, "one line"


APP = """\
import os

from celery import Celery

from celery_funnel import install

app = install(Celery("cfg_patterns", broker=os.environ["CFG_BROKER"]))
app.conf.funnel_redis_url = os.environ["CFG_BROKER"]
app.conf.funnel_limits = {{{pattern!r}: "5/s", "cfg_patterns.other": "1/s"}}


@app.task
def send(n=0):
    return n
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pattern", "named"),
    [(b"cfg_patterns.*", "funnel_limits: pattern b'cfg_patterns.*' is not a string (bytes)"),
     (None, "funnel_limits: pattern None is not a string (NoneType)")],
    ids=["bytes", "None"],
)  # fmt: skip
def test_a_celery_worker_refuses_a_bad_pattern(
    tmp_path: Path, standalone_url: str, pattern: object, named: str
) -> None:
    code, logs = refused_start(
        tmp_path, "cfg_patterns", APP.format(pattern=pattern), standalone_url
    )
    assert code != 0
    assert f"ConfigurationError: {named}" in logs, logs[-3000:]
    assert " ready." not in logs
