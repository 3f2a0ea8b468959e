"""Concurrency limits: the options and settings that ask for them, checked with errors
that name the task or entry, the option and the value; the lease header and keys."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_funnel import ConfigurationError, FunnelTask, install
from celery_funnel._celery.checks import check_app
from celery_funnel._config.options import concurrency_of, limits_of, option_of
from celery_funnel._config.runtime import runtime_for
from celery_funnel._config.settings import FunnelSettings
from celery_funnel._limiter.concurrency import ConcurrencyLimit
from celery_funnel._limiter.keys import concurrency_keys, parse_key, task_key
from celery_funnel._limiter.limit import key_part
from celery_funnel._limiter.rate import Rate
from celery_funnel._shared.state import FRESH, HEADER, State
from celery_funnel._stores.concurrency import ConcurrencyFunnel, Lease


def settings(limits: Any, **conf: Any) -> FunnelSettings:
    return FunnelSettings.from_conf(
        {"funnel_redis_url": "redis://x", "funnel_limits": limits, **conf}
    )


def test_concurrency_in_funnel_limits_alone_or_with_a_rate() -> None:
    read = settings({
        "api.*": {"concurrency": 5},
        "emails.*": {"rate": "10/s", "concurrency": 2, "scope": "worker"},
    })  # fmt: skip
    assert read.concurrency == (
        ConcurrencyLimit(5, "api.*"),
        ConcurrencyLimit(2, "emails.*", "worker"),
    )
    assert [limit.pattern for limit in read.limits] == ["emails.*"]
    assert read.limits[0].scope == "worker"
    assert read.lease_ttl == 30.0
    assert settings({}, funnel_lease_ttl=5).lease_ttl == 5.0


@pytest.mark.parametrize(
    ("limits", "conf", "message"),
    [
        ({"a.*": {"concurrency": 0}}, {}, "funnel_limits['a.*']: 'concurrency' must be an integer"),
        ({"a.*": {"concurrency": "3"}}, {}, "got '3'"),
        ({"a.*": {"concurrency": True}}, {}, "got True"),
        ({"a.*": {"concurrency": 2, "capacity": 3}}, {}, "['capacity'] need a 'rate'"),
        ({"a.*": {"concurrency": 2, "scope": "node"}}, {}, "scope must be one of"),
        ({}, {"funnel_lease_ttl": 0}, "funnel_lease_ttl"),
    ],
)
def test_bad_concurrency_settings_are_named(
    limits: dict[str, Any], conf: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=None) as raised:
        settings(limits, **conf)
    assert message in str(raised.value)


def app_with(**options: Any) -> Celery:
    app = install(Celery("concurrency_options", broker="memory://", set_as_current=False))
    app.conf.funnel_redis_url = "redis://localhost:1"

    @app.task(name="t.run", base=FunnelTask, shared=False, **options)
    def run(customer: str) -> None:
        return None

    return app


def test_funnel_concurrency_with_a_key_is_sound() -> None:
    """With a key (2 at once per customer) or beside a rate: the worker-start check
    passes, and the task reads as asked."""
    keyed = app_with(funnel_concurrency=2, funnel_key="{customer}")
    check_app(keyed)
    task = keyed.tasks["t.run"]
    assert concurrency_of(task) == 2
    assert limits_of(task) == (), "slots only: no rate limit"
    runtime = runtime_for(keyed)
    funnels = {
        runtime.task_key(task.name, key_part(option_of(task, "funnel_key"), task.run, (c,), {}))
        for c in ("a", "b", "a")
    }
    assert funnels == {task_key("funnel:", "t.run", "a"), task_key("funnel:", "t.run", "b")}

    rated = app_with(funnel_concurrency=2, funnel_rate="5/s")
    check_app(rated)
    task = rated.tasks["t.run"]
    assert concurrency_of(task) == 2
    assert [(limit.rate, limit.key) for limit in limits_of(task)] == [(Rate(5, 1.0), None)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"funnel_concurrency": 0}, "task 't.run': funnel_concurrency must be an integer"),
        ({"funnel_concurrency": 2.5}, "got 2.5"),
        ({"funnel_concurrency": 2, "funnel_key": "{client}"}, "names 'client'"),
        (
            {"funnel_rate": "1/s", "funnel_limits": [{"rate": "2/s", "concurrency": 2}]},
            "funnel_limits[0] has 'concurrency'",
        ),
        ({"funnel_concurency": 2}, "did you mean 'funnel_concurrency'"),
    ],
)
def test_bad_task_options_fail_at_the_decorator(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        app_with(**options)
    assert message in str(raised.value)


def test_a_lease_travels_in_the_header() -> None:
    lease = Lease(
        "id-1",
        "token",
        (ConcurrencyFunnel(3, "funnel:{t}", "t"), ConcurrencyFunnel(1, "funnel:{limit:*}", "l")),
    )
    header = FRESH.admitted(lease, "h:1")
    assert header["lease"]["seats"] == [[3, "funnel:{t}", "t"], [1, "funnel:{limit:*}", "l"]]
    assert State.from_headers({"id": "id-1", HEADER: header}).lease == lease
    assert State.from_headers({"id": "id-1", HEADER: {"gate": "h:1"}}).lease is None
    assert State.from_headers({"id": "id-1"}).lease is None
    run = SimpleNamespace(id="id-1", celery_funnel=header, headers=None)  # a run's Context
    assert State.of_run(run).lease == lease
    assert FRESH.header() == {}, "what a run holds is not carried on to the next delivery"


def test_seats_promised_to_a_released_waiter_travel_in_its_header_once() -> None:
    seats = (ConcurrencyFunnel(1, "funnel:{t}", "t"),)
    waited = FRESH._replace(deferrals=1)
    released = waited.released("token-1", seats)
    state = State.from_headers({HEADER: released})
    assert (state.release, state.promised) == ("token-1", seats)
    assert state._replace(promised=()) == waited._replace(release="token-1")
    assert "promised" not in state.header(), "published again, it is promised nothing"
    assert FRESH.released("token-2") == {"release": "token-2"}


def test_lease_keys_share_the_funnels_slot_and_parse() -> None:
    key = task_key("funnel:", "t.run", "c1")
    for companion, part in zip(
        concurrency_keys(key), ("leases", "lease-info", "waiters"), strict=True
    ):
        parsed = parse_key("funnel:", companion)
        assert parsed is not None
        assert (parsed.funnel, parsed.companion, parsed.name) == (key, part, "t.run:c1")
