"""Named limits: a name is an identifier, unique per task (among its own limits, among
the worker-wide ones, and between the two where a worker-wide limit charges the task);
each mistake is one line naming the task, the setting and the value."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_funnel import ConfigurationError, FunnelTask, install
from celery_funnel._celery.checks import check_app
from celery_funnel._config.runtime import runtime_for


def app_with(**conf: Any) -> Celery:
    app = install(Celery("names", broker="memory://", set_as_current=False))
    app.conf.update(funnel_redis_url="redis://127.0.0.1:1/0", **conf)
    return app


def test_a_name_twice_on_one_task_fails_where_it_is_defined() -> None:
    app = app_with()
    limits = [{"name": "tokens", "rate": "10/s"}, {"name": "tokens", "rate": "5/s"}]
    with pytest.raises(ConfigurationError) as caught:
        app.task(base=FunnelTask, funnel_limits=limits, name="names.twice", shared=False)(
            lambda: None
        )
    assert str(caught.value) == (
        "task 'names.twice': funnel_limits[1]['name']='tokens' is used twice; limit names"
        " are unique per task"
    )


def test_a_name_must_be_an_identifier() -> None:
    app = app_with()
    with pytest.raises(ConfigurationError, match=r"funnel_limits\[0\]\['name'\] must be an"):
        app.task(base=FunnelTask, funnel_limits=[{"name": "to-kens", "rate": "1/s"}],
                 name="names.bad", shared=False)(lambda: None)  # fmt: skip


def test_worker_wide_names_are_unique() -> None:
    app = app_with(funnel_limits={"a.*": {"rate": "1/s", "name": "x"},
                                  "b.*": {"rate": "1/s", "name": "x"}})  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"\['b\.\*'\]\['name'\]='x' is used twice"):
        runtime_for(app).settings  # noqa: B018 - reading them checks them


def test_a_task_and_a_worker_wide_limit_that_charges_it_share_no_name() -> None:
    app = app_with(funnel_limits={"names.*": {"rate": "1/s", "name": "tokens"}})

    @app.task(base=FunnelTask, funnel_limits=[{"name": "tokens", "rate": "10/s"}],
              name="names.clash", shared=False)  # fmt: skip
    def clash() -> None:
        pass

    with pytest.raises(ConfigurationError, match="also the name of the worker-wide"):
        check_app(app)
