from __future__ import annotations

import datetime
import decimal
import re
import uuid

import pytest
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st
from kombu.entity import Queue

from celery_funnel import ConfigurationError, FunnelTask, Rate, install
from celery_funnel._config.countdown import CountdownPolicy, policy_for
from celery_funnel._config.options import limits_of
from celery_funnel._config.runtime import runtime_for
from celery_funnel._config.settings import FunnelSettings
from celery_funnel._limiter.limit import fixed, parse_limit, safe_part
from celery_funnel._limiter.values import check_plain, did_you_mean, format_fields, to_bool


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
    assert policy_for(conf, None) == CountdownPolicy(cap, whole, limit=2 * cap)
    assert policy_for(conf, 7.5) == CountdownPolicy(7.5, whole, limit=2 * cap)  # the cap only


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
        ({"funnel_limits": {"x": {"rate": "5/s", "cost": 3}}}, "'cost'=3 is not supported"),
        ({"funnel_limits": ["x"]}, "funnel_limits"),
        ({"funnel_key_prefix": "a{b}"}, "funnel_key_prefix"),
        ({"funnel_max_countdown": -1}, "funnel_max_countdown"),
        ({"funnel_max_deferrals": 0}, "funnel_max_deferrals"),
    ],
)
def test_bad_settings_name_the_setting_and_value(conf: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        FunnelSettings.from_conf(conf)


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
    from celery_funnel._config.options import limits_of

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


# --- mistakes that were silent (issue 12): each one a ConfigurationError naming it ---


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True), (False, False), (1, True), (0, False),
        ("true", True), ("false", False), ("False", False), ("no", False),
        ("yes", True), ("on", True), ("off", False), ("1", True), ("0", False), (" NO ", False),
    ],
)  # fmt: skip
def test_booleans_accept_celerys_spellings(value: object, expected: bool) -> None:
    assert to_bool("funnel_dry_run", value) is expected
    conf = {"funnel_dry_run": value, "funnel_reservation": value, "funnel_throttle_eager": value}
    settings = FunnelSettings.from_conf(conf)
    assert (settings.dry_run, settings.reservation, settings.throttle_eager) == (expected,) * 3


@pytest.mark.parametrize("value", ["maybe", "", "disabled", 2, -1, 0.0, [], {}])
@pytest.mark.parametrize("name", ["funnel_dry_run", "funnel_reservation", "funnel_throttle_eager"])
def test_booleans_refuse_anything_else(name: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(f"{name} must be a boolean")) as info:
        FunnelSettings.from_conf({name: value})
    assert f"got {value!r}" in str(info.value)


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("funnel_limit", "funnel_limits"),
        # answered in the spelling used (issue 55: a Django project's CELERY_ name was
        # answered with the lower-case one, which its settings module cannot use)
        ("FUNNEL_LIMIT", "FUNNEL_LIMITS"),
        ("CELERY_FUNNEL_REDIS_URI", "CELERY_FUNNEL_REDIS_URL"),
        ("CELERY_FUNNEL_REDIS_ULR", "CELERY_FUNNEL_REDIS_URL"),
        ("funnel_dryrun", "funnel_dry_run"),
        ("funnel_rates", "funnel_rate"),
    ],
)
def test_misspelled_settings_fail_with_did_you_mean(key: str, suggestion: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        FunnelSettings.from_conf({key: "x"})
    message = str(info.value)
    assert f"app.conf.{key}='x' is not a celery-funnel setting" in message
    assert f"(did you mean {suggestion!r}?)" in message
    spelled = {"CELERY": "CELERY_FUNNEL_PARK", "FUNNEL": "FUNNEL_PARK"}.get(
        key.split("_", maxsplit=1)[0], "funnel_park"
    )
    assert repr(spelled) in message.split("the settings are")[1], "listed as spelled"


def test_other_librarys_upper_case_funnel_settings_are_left_alone() -> None:
    """A Django project's conf holds every Django setting: FUNNEL_ANALYTICS_ID may be
    another library's. Upper case names that resemble a setting are still refused."""
    settings = FunnelSettings.from_conf({"FUNNEL_ANALYTICS_ID": "x", "FUNNEL_REDIS_URL": "r"})
    assert settings.redis_url == "r"
    with pytest.raises(ConfigurationError, match="did you mean 'FUNNEL_REDIS_URL'"):
        FunnelSettings.from_conf({"FUNNEL_REDIS_URI": "r"})
    with pytest.raises(ConfigurationError, match="CELERY_FUNNEL_ANALYTICS_ID"):
        FunnelSettings.from_conf({"CELERY_FUNNEL_ANALYTICS_ID": "x"})


@pytest.mark.parametrize(
    ("name", "known", "hint"),
    [
        ("funnel_limit", ["funnel_limits", "funnel_rate"], " (did you mean 'funnel_limits'?)"),
        ("funnel_analytics_id", ["funnel_limits", "funnel_rate"], ""),  # not "funnel_" alike
        ("customer", ["customer_id", "n"], " (did you mean 'customer_id'?)"),
        ("custmer", ["customer", "n"], " (did you mean 'customer'?)"),
        ("x", [], ""),
    ],
)
def test_did_you_mean(name: str, known: list[str], hint: str) -> None:
    assert did_you_mean(name, known) == hint


def test_task_options_in_app_conf_say_where_they_belong() -> None:
    with pytest.raises(ConfigurationError, match="task options go on a FunnelTask"):
        FunnelSettings.from_conf({"funnel_rate": "5/s"})


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"funnel_max_countdown": 1e-9}, "funnel_max_countdown must be a number of seconds"
         " from 0.05 to 86400, got 1e-09"),
        ({"funnel_max_countdown": 10**7}, "funnel_max_countdown must be a number of seconds"),
        ({"funnel_socket_timeout": 1e12}, "funnel_socket_timeout must be a number of seconds"
         " from 0.01 to 300, got 1000000000000.0"),
        ({"funnel_socket_timeout": 0}, "funnel_socket_timeout must be a number of seconds"),
        ({"funnel_socket_timeout": float("nan")}, "funnel_socket_timeout must be a number"),
        ({"funnel_socket_timeout": "1"}, "got '1'"),
        ({"funnel_limits": {"x": {"rate": "5/s", "capacity": 10**12}}},
         "capacity must be an integer from 1 to 1_000_000, got 1000000000000"),
        ({"funnel_limits": {"x": "2000000/s"}}, "faster than one unit per microsecond"),
        ({"funnel_on_backend_error": "defered"}, "(did you mean 'defer'?)"),
        ({"funnel_limits": {"x": {"rate": "5/s", "strategy": "sliding-window"}}},
         "(did you mean 'sliding_window'?)"),
        ({"funnel_limits": {"x": {"rate": "5/s", "capcity": 2}}},
         "unknown option 'capcity' (did you mean 'capacity'?)"),
    ],
)  # fmt: skip
def test_values_no_one_means_are_refused(conf: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        FunnelSettings.from_conf(conf)


def test_bounds_admit_what_people_mean() -> None:
    settings = FunnelSettings.from_conf({
        "funnel_max_countdown": 0.05, "funnel_socket_timeout": 300,
        "funnel_limits": {"x": {"rate": "1000000/s", "capacity": 10**6}},
    })  # fmt: skip
    assert (settings.max_countdown, settings.socket_timeout) == (0.05, 300.0)
    assert settings.limits[0].capacity == 10**6
    assert Rate.parse("1000000/s").count == 10**6  # one per microsecond: the resolution


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"rate": "5/s", "key": "{customer}"}, "'key'='{customer}' is not supported"),
        ({"rate": "5/s", "cost": 2, "capacity": 5}, "'cost'=2 is not supported"),
        ({"rate": "5/s", "cost": len}, "use a FunnelTask with funnel_cost"),
    ],
)  # fmt: skip
def test_worker_wide_limits_refuse_key_and_cost(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)) as info:
        FunnelSettings.from_conf({"funnel_limits": {"emails.*": spec}})
    assert "funnel_limits['emails.*']" in str(info.value)
    assert "in worker-wide limits" in str(info.value)


@pytest.mark.parametrize(
    ("key", "fields"),
    [("{customer}", ["customer"]), ("{a.id}:{b[0]}-{c!r:>4}", ["a", "b", "c"]), ("fixed", [])],
)
def test_key_fields(key: str, fields: list[str]) -> None:
    assert format_fields("funnel_key", key) == fields


@pytest.mark.parametrize(
    ("key", "message"),
    [("{}", "each field must name a parameter"), ("{0}", "got {0}"), ("{customer", "not a valid")],
)
def test_bad_key_format_strings(key: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        parse_limit({"rate": "5/s", "key": key}, where="task 't'")


class _Customer:
    id = 7


@pytest.mark.parametrize(
    "value",
    ["c1", b"c1", 7, 2.5, True, None, uuid.UUID(int=1), decimal.Decimal("1.5"),
     datetime.date(2026, 1, 1), datetime.datetime(2026, 1, 1, 12), [1, "a"], {"a": (1, 2)}],
)  # fmt: skip
def test_plain_key_values(value: object) -> None:
    assert check_plain("funnel_key", "customer", value) is value


@pytest.mark.parametrize("value", [_Customer(), object(), {1, 2}, [object()], {"a": _Customer()}])
def test_key_values_whose_str_is_unstable_are_refused(value: object) -> None:
    def run(customer: object) -> None: ...

    limit = parse_limit({"rate": "5/s", "key": "{customer}"})
    with pytest.raises(ConfigurationError, match="cannot be part of a funnel key") as info:
        limit.key_part(run, (value,), {})
    assert f"customer={value!r}" in str(info.value)
    assert parse_limit({"rate": "5/s", "key": "{customer.id}"}).key_part(run, (_Customer(),), {})
    assert "e.g. '{customer.id}'" in str(info.value)
    callable_key = parse_limit({"rate": "5/s", "key": lambda customer: customer})
    with pytest.raises(ConfigurationError, match="key\\(\\)=") as info:
        callable_key.key_part(run, (value,), {})
    assert str(info.value).endswith("None): return one")


def test_funnel_task_classes_are_checked_where_they_are_defined() -> None:
    with pytest.raises(ConfigurationError) as info:

        class Misspelled(FunnelTask):
            name = "t.misspelled"
            funnel_rate = "5/s"
            funnel_capcity = 3

    assert "task 't.misspelled': funnel_capcity=3 is not a FunnelTask option" in str(info.value)
    assert "(did you mean 'funnel_capacity'?)" in str(info.value)

    with pytest.raises(ConfigurationError) as info:

        class Missing(FunnelTask):
            name = "t.missing"
            funnel_rate = "5/s"
            funnel_key = "{custmer}"

            def run(self, customer: str, n: int = 0) -> None: ...

    assert "funnel_key='{custmer}' names 'custmer', which is not a parameter" in str(info.value)
    assert "(did you mean 'customer'?)" in str(info.value)

    with pytest.raises(ConfigurationError, match=re.escape("funnel_limits[1]['key']")):

        class Entry(FunnelTask):
            name = "t.entry"
            funnel_limits = ({"rate": "5/s"}, {"rate": "5/m", "key": "{region}"})

            def run(self, customer: str) -> None: ...

    with pytest.raises(ConfigurationError, match="funnel_dry_run must be a boolean"):

        class DryRun(FunnelTask):
            name = "t.dry"
            funnel_rate = "5/s"
            funnel_dry_run = "sometimes"  # type: ignore[assignment]


def test_abstract_bases_are_checked_with_their_tasks() -> None:
    class PerCustomer(FunnelTask):  # no run of its own: its key is checked on subclasses
        funnel_rate = "5/s"
        funnel_key = "{customer}"

    class Good(PerCustomer):
        name = "t.good"

        def run(self, customer: str) -> None: ...

    assert [limit.key for limit in limits_of(Good)] == ["{customer}"]
    with pytest.raises(ConfigurationError, match="'customer', which is not a parameter"):

        class Bad(PerCustomer):
            name = "t.bad"

            def run(self, tenant: str) -> None: ...


def test_a_subclass_may_override_funnel_methods() -> None:
    class Custom(FunnelTask):
        name = "t.custom"
        funnel_rate = "5/s"

        def funnel_backoff(self, seconds: float) -> None: ...

    assert limits_of(Custom)[0].rate == Rate(5, 1)


def test_charges_are_built_once_only_when_every_run_pays_alike() -> None:
    app = install(Celery("charges", broker="memory://", set_as_current=False))
    app.conf.update(funnel_redis_url="redis://127.0.0.1:1/0")

    @app.task(base=FunnelTask, funnel_rate="5/s", shared=False)
    def one_funnel(n: int) -> None: ...

    @app.task(base=FunnelTask, funnel_rate="5/s", funnel_key="{n}", shared=False)
    def per_n(n: int) -> None: ...

    @app.task(base=FunnelTask, funnel_rate="5/s", funnel_cost=lambda n: n, shared=False)
    def costly(n: int) -> None: ...

    app.finalize()
    one_funnel, per_n, costly = (app.tasks[t.name] for t in (one_funnel, per_n, costly))
    runtime = runtime_for(app)
    assert [fixed(limits_of(t)[0]) for t in (one_funnel, per_n, costly)] == [True, False, False]
    first, second = (one_funnel._funnel_charges(runtime, (n,), {}) for n in (1, 2))
    assert first == second
    assert first is not second  # a copy: a caller may extend its list
    assert one_funnel._funnel_charges(runtime, (3,), {})[0] is first[0]  # built once
    keys = {per_n._funnel_charges(runtime, (n,), {})[0].key for n in (1, 2)}
    assert len(keys) == 2
    assert [costly._funnel_charges(runtime, (n,), {})[0].cost for n in (1, 2)] == [1, 2]
