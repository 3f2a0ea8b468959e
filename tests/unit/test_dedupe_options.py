"""Unique and debounced tasks: their options, checked where the task is defined with one
line naming the task, the option and the value; their keys under the prefix."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_funnel import ConfigurationError, FunnelTask, install
from celery_funnel._celery.checks import check_app
from celery_funnel._config.dedupe import DEFAULT_UNIQUE_TTL, Debounce, Unique
from celery_funnel._config.options import debounce_of, limits_of, unique_of
from celery_funnel._limiter.keys import debounce_key, hash_tag, parse_key, task_key, unique_key


def app_with(**options: Any) -> Celery:
    app = install(Celery("dedupe_options", broker="memory://", set_as_current=False))
    app.conf.funnel_redis_url = "redis://localhost:1"

    @app.task(name="t.run", base=FunnelTask, shared=False, **options)
    def run(record: str, n: int = 0) -> None:
        return None

    return app


def test_unique_and_debounce_read_as_asked_without_a_rate() -> None:
    unique = app_with(funnel_unique=True, funnel_key="{record}")
    check_app(unique)
    task = unique.tasks["t.run"]
    assert unique_of(task) == Unique("{record}", DEFAULT_UNIQUE_TTL)
    assert debounce_of(task) is None
    assert limits_of(task) == ()

    debounced = app_with(funnel_debounce=2, funnel_debounce_max=10, funnel_key="{record}")
    check_app(debounced)
    task = debounced.tasks["t.run"]
    assert debounce_of(task) == Debounce("{record}", 2.0, 10.0)
    assert unique_of(task) is None

    both = app_with(funnel_unique=True, funnel_unique_ttl=5, funnel_key="{record}",
                    funnel_rate="5/s", funnel_concurrency=2)  # fmt: skip
    check_app(both)
    assert unique_of(both.tasks["t.run"]) == Unique("{record}", 5.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"funnel_unique": True}, "task 't.run': funnel_unique=True needs funnel_key"),
        ({"funnel_debounce": 1}, "task 't.run': funnel_debounce=1 needs funnel_key"),
        (
            {"funnel_debounce": 5, "funnel_debounce_max": 2, "funnel_key": "{record}"},
            "task 't.run': funnel_debounce_max=2 is less than funnel_debounce=5",
        ),
        (
            {"funnel_debounce": 0, "funnel_key": "{record}"},
            "task 't.run': funnel_debounce must be a positive number of seconds, got 0",
        ),
        (
            {"funnel_debounce": -1, "funnel_key": "{record}"},
            "task 't.run': funnel_debounce must be a number of seconds",
        ),
        (
            {"funnel_debounce": "1s", "funnel_key": "{record}"},
            "task 't.run': funnel_debounce must be a number of seconds",
        ),
        (
            {"funnel_unique": True, "funnel_unique_ttl": 0, "funnel_key": "{record}"},
            "task 't.run': funnel_unique_ttl must be a number of seconds from 3",
        ),
        (
            {"funnel_unique": True, "funnel_unique_ttl": 1, "funnel_key": "{record}"},
            "funnel_unique_ttl must be a number of seconds from 3 to 2.592e+06, got 1",
        ),
        ({"funnel_unique_ttl": 5}, "funnel_unique_ttl=5 has no effect without funnel_unique"),
        ({"funnel_debounce_max": 5}, "funnel_debounce_max=5 has no effect without funnel_deb"),
        (
            {"funnel_unique": True, "funnel_debounce": 1, "funnel_key": "{record}"},
            "task 't.run': funnel_unique=True and funnel_debounce=1 on one task",
        ),
        ({"funnel_unique": "maybe", "funnel_key": "{record}"}, "funnel_unique must be a boolean"),
        ({"funnel_unique": True, "funnel_key": "{customer}"}, "names 'customer'"),
        ({"funnel_debonce": 1}, "did you mean 'funnel_debounce'"),
    ],
)
def test_bad_options_fail_at_the_decorator_in_one_line(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        app_with(**options)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_bad_options_given_by_annotations_fail_at_worker_start() -> None:
    app = app_with()
    app.conf.task_annotations = {"t.run": {"funnel_debounce": 3, "funnel_debounce_max": 1}}
    app.tasks["t.run"].funnel_debounce = 3  # what annotations do, on a finalized app
    app.tasks["t.run"].funnel_debounce_max = 1
    with pytest.raises(ConfigurationError, match="funnel_debounce_max=1 is less than"):
        check_app(app)


def test_the_keys_live_under_the_prefix_beside_their_funnel() -> None:
    funnel = task_key("funnel:", "t.run", "r1")
    assert unique_key(funnel) == "funnel:{t.run:r1}#unique"
    assert hash_tag(unique_key(funnel)) == hash_tag(funnel)
    assert parse_key("funnel:", unique_key(funnel)) is not None  # status and reset see it
    window = debounce_key("funnel:", "t.run", "r1")
    assert window == "funnel:{~parked}#debounce:t.run:r1"
    assert debounce_key("funnel:", "t.run") == "funnel:{~parked}#debounce:t.run"
