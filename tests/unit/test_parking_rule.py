"""The rule for parking (``_stores.persistence``): a task waits nowhere less safe than the
broker's queue. The funnels' Redis may keep a parked task where it has an append-only
file, or where it is the broker's own Redis server (the same ``run_id``), read at start
and again after a refresh; a restart of either side is read again. Fakes stand for the
two servers: ``INFO`` only, as the real code asks."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from celery_funnel._config.broker import BrokerRedis, broker_url_of
from celery_funnel._limiter.errors import ConfigurationError
from celery_funnel._stores.persistence import RECHECK_SECONDS, Persistence, Rule


class Server:
    """A fake Redis server: ``INFO persistence`` and ``INFO server`` only."""

    def __init__(self, run_id: str, aof: bool = False) -> None:
        self.run_id, self.aof, self.down, self.asked = run_id, aof, False, 0

    def info(self, section: str) -> dict[str, Any]:
        self.asked += 1
        if self.down:
            raise redis.ConnectionError("down")
        if section == "persistence":
            return {"aof_enabled": int(self.aof)}
        return {"run_id": self.run_id}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def persistence(
    funnels: Server, broker: Server | None, mode: bool | str = "auto"
) -> tuple[Persistence, Clock]:
    clock = Clock()
    ask = (lambda: broker) if broker is not None else None
    return Persistence(lambda: funnels, mode, clock, broker=ask, broker_why="why"), clock


def test_aof_parks_without_asking_the_broker() -> None:
    broker = Server("b")
    kept, _ = persistence(Server("f", aof=True), broker)
    assert kept.rule() is Rule.AOF
    assert kept.keeps()
    assert broker.asked == 0


def test_the_brokers_own_server_parks_without_aof() -> None:
    """db 1 (broker) and db 2 (funnels) of one server: one run_id."""
    shared = Server("same")
    kept, _ = persistence(shared, shared)
    assert kept.rule() is Rule.BROKER
    assert kept.keeps()


@pytest.mark.parametrize("broker", [Server("other"), None], ids=["another Redis", "not Redis"])
def test_another_server_without_aof_parks_nothing(broker: Server | None) -> None:
    kept, _ = persistence(Server("f"), broker)
    assert kept.rule() is Rule.NONE
    assert not kept.keeps()


def test_funnel_park_false_never_parks() -> None:
    shared = Server("same")
    kept, _ = persistence(shared, shared, mode=False)
    assert not kept.keeps()


def test_funnel_park_true_refuses_to_start_only_where_the_rule_refuses() -> None:
    shared = Server("same")
    persistence(shared, shared, mode=True)[0].start()  # the broker's own server: starts
    refused = persistence(Server("f"), Server("b"), mode=True)[0]
    with pytest.raises(ConfigurationError, match="not the broker's Redis server \\(why\\)"):
        refused.start()


@pytest.mark.parametrize(
    ("funnels", "same", "said"),
    [
        (Server("f", aof=True), False, "parking is on: the funnels' Redis has an append-only"),
        (Server("s"), True, "parking is on: the funnels' Redis is the broker's own Redis"),
        (Server("f"), False, "parking is off: the funnels' Redis has no append-only file and"),
    ],
    ids=["AOF", "the broker's server", "neither"],
)
def test_the_start_line_says_which_rule_applies(
    caplog: pytest.LogCaptureFixture, funnels: Server, same: bool, said: str
) -> None:
    caplog.set_level(logging.INFO, logger="celery_funnel")
    persistence(funnels, funnels if same else Server("b"))[0].start()
    lines = [
        r.getMessage() for r in caplog.records if "celery-funnel: parking is" in r.getMessage()
    ]
    assert len(lines) == 1, lines
    assert said in lines[0]


def test_parking_stops_when_they_stop_being_one_server(caplog: pytest.LogCaptureFixture) -> None:
    """The broker's server answers with another run_id (a failover, a moved DNS name):
    read at the next refresh, parking stops, as when AOF is turned off."""
    # a worker started in this process before (start_worker) leaves the root logger at
    # ERROR: the lines are captured only with the package's own logger set
    caplog.set_level(logging.INFO, logger="celery_funnel")
    funnels, broker = Server("same"), Server("same")
    kept, clock = persistence(funnels, broker)
    assert kept.keeps()
    broker.run_id = "elsewhere"
    assert kept.keeps(), "read again only after RECHECK_SECONDS"
    clock.now += RECHECK_SECONDS
    assert not kept.keeps()
    assert any("parking stops" in r.getMessage() for r in caplog.records)
    broker.run_id = "same"
    kept.stale()  # a reconnect to the broker: read again at once
    assert kept.keeps()
    assert any("parking starts" in r.getMessage() for r in caplog.records)


def test_a_restart_of_the_shared_server_keeps_them_one_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One server restarted: both run_ids change together; parking goes on, and the
    line says the parked tasks were lost with the broker's queue."""
    caplog.set_level(logging.INFO, logger="celery_funnel")  # as above
    shared = Server("one")
    kept, _ = persistence(shared, shared)
    assert kept.rule() is Rule.BROKER
    shared.run_id = "two"
    kept.stale()
    assert kept.rule() is Rule.BROKER
    said = [r.getMessage() for r in caplog.records if "restarted" in r.getMessage()]
    assert len(said) == 1, said
    assert "lost with the tasks queued in the broker" in said[0]


def test_an_unreadable_broker_keeps_what_was_known_unless_the_funnels_restarted() -> None:
    funnels, broker = Server("same"), Server("same")
    kept, _ = persistence(funnels, broker)
    assert kept.keeps()
    broker.down = True
    kept.stale()
    assert kept.keeps(), "the same server as before: still the broker's"
    funnels.run_id = "new"
    kept.stale()
    assert kept.rule() is None, "restarted: not known until the broker is read"
    assert not kept.keeps()


def test_an_unreadable_funnels_redis_is_not_known() -> None:
    funnels = Server("f")
    funnels.down = True
    assert persistence(funnels, funnels)[0].rule() is None
    assert persistence(funnels, funnels, mode=True)[0].keeps()  # True insists


@pytest.mark.parametrize(
    ("conf", "url"),
    [
        ({"broker_url": "redis://h:6379/1"}, "redis://h:6379/1"),
        ({"broker_url": "redis://a/1;redis://b/1"}, "redis://a/1"),
        ({"broker_url": ["redis://a/1", "redis://b/1"]}, "redis://a/1"),
        ({"broker_url": "redis://a/1", "broker_write_url": "redis://w/2"}, "redis://w/2"),
        ({}, ""),
    ],
)
def test_the_broker_url_is_where_tasks_are_published(conf: dict[str, Any], url: str) -> None:
    assert broker_url_of(conf) == url


@pytest.mark.parametrize(
    ("url", "redis_", "why"),
    [
        ("redis://127.0.0.1:6379/1", True, ""),
        ("rediss://127.0.0.1:6379/1", True, ""),
        ("redis+socket:///tmp/redis.sock", True, ""),
        ("sentinel://127.0.0.1:26379", False, "Sentinel"),
        ("amqp://guest@127.0.0.1//", False, "not Redis (amqp://)"),
        ("", False, "not Redis (amqp://)"),
    ],
)
def test_which_brokers_are_compared(url: str, redis_: bool, why: str) -> None:
    broker = BrokerRedis({"broker_url": url})
    assert broker.redis is redis_
    assert why in broker.why
    assert bool(why) == bool(broker.why)
    assert (broker.client() is not None) is redis_  # made, not connected
    broker.close()


@pytest.mark.parametrize(
    ("park", "rule", "refused"),
    [
        ("auto", Rule.AOF, ""),
        ("auto", Rule.BROKER, ""),
        ("auto", None, ""),  # not known at start: allowed (parking waits for it)
        ("auto", Rule.NONE, "no append-only file and is not the broker's Redis server"),
        (False, Rule.AOF, "funnel_park=False"),
    ],
)
def test_fair_share_refuses_to_start_where_nothing_may_be_parked(
    park: bool | str, rule: Rule | None, refused: str
) -> None:
    """Never silently an ordinary funnel: one line naming the task and why."""
    from celery import Celery

    from celery_funnel import FunnelTask, install
    from celery_funnel._celery.checks import check_fair

    app = Celery("fair_rule", set_as_current=False)
    app.conf.funnel_redis_url = "redis://127.0.0.1:1/0"
    install(app)

    @app.task(
        name="t.fair", shared=False, base=FunnelTask, funnel_rate="1/s", funnel_fair_by="{tenant}"
    )
    def fair(tenant: str) -> None: ...

    if not refused:
        check_fair(app, park, rule)
        return
    with pytest.raises(ConfigurationError) as raised:
        check_fair(app, park, rule)
    assert str(raised.value).startswith("task 't.fair': funnel_fair_by queues each tenant's")
    assert refused in str(raised.value)
    assert "\n" not in str(raised.value)
