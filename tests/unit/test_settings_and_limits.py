from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kombu.entity import Queue

from celery_funnel import ConfigurationError, Rate
from celery_funnel._countdown import CountdownPolicy, policy_for
from celery_funnel._limit import parse_limit, safe_part
from celery_funnel._settings import FunnelSettings


@pytest.mark.parametrize(
    ("conf", "cap", "whole"),
    [
        ({"broker_url": "redis://x"}, 1800.0, False),
        (
            {"broker_url": "redis://x", "broker_transport_options": {"visibility_timeout": 100}},
            50.0,
            False,
        ),
        ({"broker_url": "amqp://x"}, 900.0, False),
        ({"broker_url": "pyamqp://x", "task_default_queue_type": "quorum"}, 900.0, True),
        (
            {
                "broker_url": "amqp://x",
                "task_queues": [Queue("q", queue_arguments={"x-queue-type": "quorum"})],
            },
            900.0,
            True,
        ),
        ({"broker_url": "memory://"}, 1800.0, False),
    ],
)
def test_countdown_cap_follows_the_broker(conf: dict[str, object], cap: float, whole: bool) -> None:
    assert policy_for(conf, None) == CountdownPolicy(cap, whole)
    assert policy_for(conf, 7.5).cap == 7.5  # funnel_max_countdown wins


def test_countdowns() -> None:
    assert CountdownPolicy(10.0).countdown(0.25) == 0.25
    assert CountdownPolicy(10.0).countdown(42.0) == 10.0
    whole = CountdownPolicy(10.0, whole_seconds=True)
    assert [whole.countdown(d) for d in (1.0, 1.9, 2.5, 99.0)] == [1.0, 1.0, 2.0, 10.0]
    assert whole.waits_in_place(0.4)
    assert not whole.waits_in_place(1.0)
    assert not CountdownPolicy(10.0).waits_in_place(0.4)


@pytest.mark.parametrize("spell", [str.lower, str.upper, lambda n: "CELERY_" + n.upper()])
def test_settings_in_every_spelling(spell: object) -> None:
    conf = {spell("funnel_redis_url"): "redis://r", spell("funnel_limits"): {"a.*": "5/s"}}  # type: ignore[operator]
    settings = FunnelSettings.from_conf(conf)
    assert settings.redis_url == "redis://r"
    assert settings.limits[0].rate == Rate(5, 1)
    assert settings.limits[0].pattern == "a.*"


@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ({"funnel_limits": {"x": "0/s"}}, "funnel_limits['x']"),
        ({"funnel_limits": {"x": {"rate": "5/s", "capacity": 0}}}, "capacity"),
        ({"funnel_limits": {"x": {"rate": "5/s", "scope": "planet"}}}, "scope"),
        ({"funnel_limits": {"x": {"rate": "5/s", "strategy": "magic"}}}, "strategy"),
        ({"funnel_limits": {"x": {"rate": "5/s", "cost": 3}}}, "above capacity"),
        ({"funnel_limits": ["x"]}, "funnel_limits"),
        ({"funnel_key_prefix": "a{b}"}, "funnel_key_prefix"),
        ({"funnel_max_countdown": -1}, "funnel_max_countdown"),
        ({"funnel_max_deferrals": 0}, "funnel_max_deferrals"),
    ],
)
def test_bad_settings_name_the_setting_and_value(conf: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        FunnelSettings.from_conf(conf)


def test_unknown_setting_warns() -> None:
    with pytest.warns(UserWarning, match="funnel_ratee"):
        FunnelSettings.from_conf({"funnel_ratee": 1})


def test_redis_url_is_required_and_never_the_broker() -> None:
    with pytest.raises(ConfigurationError, match="funnel_redis_url is not set"):
        FunnelSettings.from_conf({"broker_url": "redis://b"}).require_redis()


def test_limit_keys_from_arguments() -> None:
    def task(customer_id: str, region: str = "eu") -> None: ...

    limit = parse_limit({"rate": "5/s", "key": "{customer_id}:{region}"})
    assert limit.key_part(task, ("c1",), {}) == "c1:eu"
    assert limit.key_part(task, (), {"customer_id": "a b{c}"}).startswith("~")
    with pytest.raises(TypeError):
        limit.key_part(task, (), {})  # a missing argument


@given(st.one_of(st.text(), st.binary(), st.integers(), st.floats(allow_nan=False)))
def test_key_parts_stay_inside_their_key(value: object) -> None:
    part = safe_part(value)
    assert re.fullmatch(r"[A-Za-z0-9_.:@*?=+~-]{1,64}", part)
    assert "{" not in part
    assert "}" not in part
    assert safe_part(value) == part  # stable


def test_several_limits_need_gcra_and_a_list() -> None:
    from celery_funnel._task_options import limits_of

    class Base:
        funnel_rate = "5/s"
        funnel_capacity = 1
        funnel_strategy = "gcra"
        funnel_key = None
        funnel_cost = 1

    class Two(Base):
        funnel_limits = ({"rate": "100/d"},)

    class Windows(Base):
        funnel_limits = ({"rate": "100/d", "strategy": "fixed_window"},)

    class NotAList(Base):
        funnel_limits = "100/d"

    assert [limit.rate for limit in limits_of(Two)] == [Rate(5, 1), Rate(100, 86400)]
    with pytest.raises(ConfigurationError, match="need the 'gcra' strategy"):
        limits_of(Windows)
    with pytest.raises(ConfigurationError, match="must be a list"):
        limits_of(NotAList)
