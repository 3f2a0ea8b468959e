"""Runtime overrides without a server: checking values, the worker's table, and the
control API's refusals (which happen before anything is written)."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from celery_funnel import ConfigurationError, FunnelTask, Rate, control, install
from celery_funnel._limiter.limit import Limit
from celery_funnel._shared.charges import Charge
from celery_funnel._shared.overrides import (
    Override,
    OverrideTable,
    changes,
    concurrency_for,
    parse_ttl,
)
from celery_funnel.dashboard._security import Guard, check_binding, is_loopback


def table_of(**entries: Override) -> OverrideTable:
    table = OverrideTable()
    table.load({name.replace("_", "."): o.to_json() for name, o in entries.items()})
    return table


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (90, 90.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("1h", 3600.0),
        ("2d", 172800.0),
        ("1.5h", 5400.0),
    ],
)
def test_ttl_forms(given: str | float, seconds: float) -> None:
    assert parse_ttl(given) == seconds


@pytest.mark.parametrize("bad", ["0s", "-1h", "soon", "1w", 0, True, 10**9])
def test_a_bad_ttl_is_named(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=f"ttl.*got {bad!r}"):
        parse_ttl(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rate", "capacity", "concurrency", "message"),
    [
        ("fast", None, None, "invalid rate 'fast'"),
        (None, 0, None, "override capacity must be an integer from 1 to .*, got 0"),
        (None, "3", None, "override capacity .* got '3'"),
        (None, None, -2, "override concurrency .* got -2"),
    ],
)
def test_bad_override_values_are_named(
    rate: str | None, capacity: object, concurrency: object, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Override.checked(rate, capacity, concurrency)


def test_an_override_round_trips_and_expires() -> None:
    entry = Override.checked("20/s", 5, 3, paused=True, by="ann@box", at=10.0, expires_at=20.0)
    assert Override.from_json(entry.to_json()) == entry
    assert not entry.expired(19.9)
    assert entry.expired(20.0)
    assert Override(paused=False).empty
    with pytest.raises(ConfigurationError, match="not a stored override"):
        Override.from_json("{nope")


def test_the_table_replaces_rate_and_capacity_of_matching_charges_only() -> None:
    code = Limit(Rate.parse("10/s"), 2)
    mine, other = Charge(code, "k1", 1, "emails.send"), Charge(code, "k2", 1, "limit:*")
    table = table_of(emails_send=Override.checked("20/s", None, None))
    applied = table.apply([mine, other])
    assert (str(applied[0].limit.rate), applied[0].limit.capacity) == ("20/s", 2)
    assert applied[1] is other
    assert table.apply([mine])[0].limit is applied[0].limit, "built once, then cached"
    assert OverrideTable().apply([mine])[0] is mine
    # a map's batch (cost 7) keeps fitting a smaller capacity override
    smaller = table_of(emails_send=Override.checked(None, 3, None))
    assert smaller.apply([Charge(code, "k1", 7, "emails.send")])[0].limit.capacity == 7


def test_paused_expired_and_concurrency() -> None:
    charge = Charge(Limit(Rate.parse("10/s")), "k", 1, "emails.send")
    past = time.time() - 1
    table = table_of(emails_send=Override(paused=True))
    assert table.paused([charge]) == "emails.send"
    assert table_of(emails_send=Override(paused=True, expires_at=past)).paused([charge]) is None
    assert concurrency_for(table_of(a=Override.checked(None, None, 4)), "a", 9) == 4
    assert concurrency_for(table, "emails.send", 9) == 9
    assert concurrency_for(None, "x", None) is None


def test_changes_say_which_limits_changed_and_which_pauses_ended() -> None:
    rate, pause = Override.checked("5/s", None, None), Override(paused=True)
    found = changes({"a": rate, "b": pause}, {"b": Override(paused=False), "c": pause})
    assert found["a"].limit
    assert not found["a"].unpaused
    assert found["b"].unpaused
    assert not found["b"].limit
    assert not found["c"].limit
    assert set(found) == {"a", "b", "c"}


def _noop() -> None:
    return None


def test_control_refuses_unknown_funnels_and_bad_values_before_writing() -> None:
    app = Celery("ctl", set_as_current=False)
    app.conf.update(funnel_redis_url="redis://127.0.0.1:1/0", funnel_limits={"mail.*": "5/s"})
    install(app)
    app.task(name="emails.send", base=FunnelTask, funnel_rate="10/s", shared=False)(_noop)
    assert control.funnel_names(app) == ["emails.send", "limit:mail.*"]
    with pytest.raises(
        ConfigurationError, match=r"no funnel 'emails.sned'.*did you mean 'emails.send'"
    ):
        control.pause(app, "emails.sned")
    with pytest.raises(ConfigurationError, match="invalid rate '20 per second'"):
        control.set_override(app, "emails.send", "20 per second")
    with pytest.raises(ConfigurationError, match="needs a rate, a capacity or a concurrency"):
        control.set_override(app, "limit:mail.*")
    with pytest.raises(ConfigurationError, match=r"ttl .* got 'forever'"):
        control.pause(app, "limit:mail.*", ttl="forever")
    app.close()


def test_the_dashboard_needs_a_token_beyond_loopback() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    check_binding("127.0.0.1", None, None)
    check_binding("0.0.0.0", "x" * 16, None)
    check_binding("10.1.2.3", None, "ops:secret")
    with pytest.raises(ConfigurationError, match=r"bound to '0\.0\.0\.0'"):
        check_binding("0.0.0.0", None, None)
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        check_binding("0.0.0.0", "short", None)
    with pytest.raises(ConfigurationError, match="user:password"):
        check_binding("0.0.0.0", None, "nocolon")
    assert Guard().open
    assert not Guard(token="x" * 16).open
