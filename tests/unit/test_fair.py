"""Fair share's options and ordering rules, without a server: bad options fail named
(task, option, value), and the priority rank follows the broker's order."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from celery import Celery

from celery_funnel import ConfigurationError, FunnelTask
from celery_funnel._config.options import limits_of
from celery_funnel._limiter.fair import RANKS, Fair, check_fair, rank, weight_of
from celery_funnel._limiter.keys import fair_keys, parse_key
from celery_funnel._limiter.limit import parse_limit
from celery_funnel._shared.fair import fair_of


def test_a_tenant_and_its_weight_come_from_the_arguments() -> None:
    limit = parse_limit({"rate": "20/s", "fair_by": "{customer}", "weights": {"big": 3}})

    def run(customer: str, n: int = 0) -> None: ...

    assert fair_of(limit, run, ("big",), {}) == Fair("big", 3.0)
    assert fair_of(limit, run, (), {"customer": "small"}) == Fair("small", 1.0)
    by_call = parse_limit({"rate": "1/s", "fair_by": lambda c, n=0: c.upper(), "weights": len})
    assert fair_of(by_call, run, ("ab",), {}) == Fair("AB", 2.0)
    assert fair_of(parse_limit("1/s"), run, ("x",), {}) is None


def test_tenants_are_safe_key_parts() -> None:
    limit = parse_limit({"rate": "1/s", "fair_by": "{c}"})

    def run(c: str) -> None: ...

    fair = fair_of(limit, run, ("a b{c}",), {})
    assert fair is not None
    assert fair.tenant.startswith("~")  # hashed: no byte of the value reaches a key


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"fair_by": 3}, "fair_by must be a format string or a callable, got 3"),
        ({"fair_by": "{a"}, "fair_by"),
        ({"weights": {"a": 2}}, "weights={'a': 2} has no effect without fair_by"),
        ({"fair_by": "{a}", "weights": {"a": 0}}, "weight of tenant 'a' must be a number > 0"),
        ({"fair_by": "{a}", "weights": {"a": True}}, "got True"),
        ({"fair_by": "{a}", "weights": [1]}, "weights must be a mapping"),
        ({"fair_by": "{a}", "strategy": "sliding_log"}, "fair_by needs the 'gcra' strategy"),
    ],
)
def test_bad_fair_options_are_named(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError, match="where: ") as info:
        parse_limit({"rate": "1/s", **spec}, where="where")
    assert words in str(info.value)


def test_a_callable_weight_must_give_a_number() -> None:
    with pytest.raises(ConfigurationError, match="weight of tenant 'x' must be a number > 0"):
        weight_of(lambda tenant: "heavy", "x")
    assert weight_of(None, "x") == 1.0


def test_task_options_fail_where_the_task_is_made() -> None:
    app = Celery(set_as_current=False)
    task = app.task(
        name="t1", shared=False, base=FunnelTask, funnel_rate="1/s", funnel_fair_by="{customr}"
    )
    with pytest.raises(ConfigurationError, match=r"task 't1'.*funnel_fair_by='\{customr\}'"):
        _ = task(_customer).name  # the proxy makes the task class here
    weights = {"funnel_rate": "1/s", "funnel_weights": {"a": 2}}
    with pytest.raises(ConfigurationError, match=r"funnel_weights=.* without funnel_fair_by"):
        type("Weighted", (FunnelTask,), {"name": "t2", **weights})
    twice = {"funnel_fair_by": "{a}", "funnel_limits": [{"rate": "2/s", "fair_by": "{a}"}]}
    with pytest.raises(ConfigurationError, match="fair_by is set on several limits"):
        limits_of(type("Twice", (FunnelTask,), {"name": "t3", "funnel_rate": "1/s", **twice}))


def _customer(customer: str) -> None: ...


def test_worker_wide_limits_refuse_fair_by() -> None:
    with pytest.raises(ConfigurationError, match="'fair_by'='\\{c\\}' is not supported in worker"):
        parse_limit({"rate": "1/s", "fair_by": "{c}"}, pattern="x.*", where="funnel_limits")


def test_priority_ranks_follow_the_broker() -> None:
    # kombu's Redis transport serves 0 first; AMQP brokers serve the larger number first
    assert [rank("redis", p) for p in (0, 3, 9, None)] == [0, 3, 9, 0]
    assert [rank("amqp", p) for p in (9, 3, 0, None)] == [
        RANKS - 10,
        RANKS - 4,
        RANKS - 1,
        RANKS - 1,
    ]
    assert rank("redis", 10_000) == RANKS - 1
    assert rank("amqp", -5) == RANKS - 1


def test_fair_companions_belong_to_their_funnel() -> None:
    keys = fair_keys("p:{task:x}")
    parsed = [parse_key("p:", k) for k in keys]
    assert all(p is not None and p.funnel == "p:{task:x}" for p in parsed)
    assert parse_key("p:", "p:{~parked}#fair") is None  # the parked tasks' registry


def test_configuration_errors_pickle() -> None:
    with pytest.raises(ConfigurationError) as info:
        check_fair({"fair_by": 1}, "w")
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)
