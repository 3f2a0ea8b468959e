"""Whole-number task options take a string of digits as Celery's own options take strings
(``funnel_concurrency="3"`` was refused while ``funnel_rate="5"`` was read), and Celery's
``rate_limit`` beside ``funnel_rate`` is refused where the task is defined (both applied,
silently) (issue 43, item 6)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_funnel import ConfigurationError, FunnelTask, install
from celery_funnel._celery.checks import check_app
from celery_funnel._config.options import concurrency_of, limits_of, max_waiting_of


def app_with(conf: dict[str, Any] | None = None, **options: Any) -> Celery:
    app = install(Celery("t", broker="memory://", set_as_current=False))
    app.conf.update(funnel_redis_url="redis://x", **(conf or {}))

    @app.task(name="t.run", base=FunnelTask, shared=False, **options)
    def run() -> None:
        return None

    return app


def test_whole_number_options_take_strings_of_digits() -> None:
    app = app_with(funnel_concurrency="3", funnel_rate="5", funnel_capacity=" 4 ",
                   funnel_max_waiting="10")  # fmt: skip
    check_app(app)
    task = app.tasks["t.run"]
    assert (concurrency_of(task), max_waiting_of(task)) == (3, 10)
    assert [(str(x.rate), x.capacity) for x in limits_of(task)] == [("5/s", 4)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"funnel_concurrency": "3.0"}, "task 't.run': funnel_concurrency must be an integer"),
        ({"funnel_concurrency": "three"}, "got 'three'"),
        ({"funnel_concurrency": "0"}, "got 0"),
        ({"funnel_rate": "5/s", "funnel_max_waiting": "-1"}, "funnel_max_waiting must be"),
    ],
)
def test_other_strings_are_refused_naming_task_option_and_value(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        app_with(**options)
    assert message in str(raised.value)


def test_rate_limit_beside_funnel_rate_is_a_warning_at_the_decorator() -> None:
    """Both apply (a per-worker cap beside a shared one is allowed), and not silently:
    a Python warning, shown where no logging is set up (it was a log line, which an
    import outside a worker did not show: issue 55), pointing at the decorator's line."""
    with pytest.warns(UserWarning, match="both apply") as caught:
        app_with(funnel_rate="5/s", rate_limit="10/m")
    assert [str(w.message) for w in caught] == [
        "celery-funnel: task 't.run': rate_limit='10/m' and funnel_rate='5/s' both apply"
        " (rate_limit per worker, funnel_rate over every worker); remove rate_limit unless"
        " a per-worker cap is meant (docs/configuration.md, 'Moving off rate_limit')"
    ]
    assert caught[0].filename == __file__, "the user's decorator line"


def test_rate_limit_alone_or_from_the_apps_default_is_left_to_celery() -> None:
    check_app(app_with(rate_limit="10/m", funnel_concurrency=2))  # no funnel_rate
    app = app_with({"task_default_rate_limit": "100/s"}, funnel_rate="5/s")
    app.finalize()
    assert app.tasks["t.run"].rate_limit == "100/s"
    check_app(app)  # every task's default, not this one's own


def test_rate_limit_from_task_annotations_is_a_warning_at_worker_start() -> None:
    app = app_with(funnel_rate="5/s")
    app.conf.task_annotations = {"t.run": {"rate_limit": "1/s"}}
    type(app.tasks["t.run"]).rate_limit = "1/s"  # what annotations do, on a finalized app
    with pytest.warns(UserWarning, match="rate_limit='1/s' and funnel_rate='5/s' both apply"):
        check_app(app)
