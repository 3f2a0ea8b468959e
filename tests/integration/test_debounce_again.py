"""Debounced tasks (``funnel_debounce``) sent again from one producer process
(issue 40, items 3 and 4): a ``task_id`` given to a send that opens a window is the
run's id, also once the process sent the key before; a group of debounced tasks sent
twice completes both times; a send that the funnels' Redis could lose is refused at
send time. On a Redis broker and on RabbitMQ, with real ``celery worker`` processes
and a real Redis with AOF."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery, group, states

from celery_funnel import ConfigurationError
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import RedisServer
from tests.integration.proj import close_app, make_app, runs
from tests.integration.test_one_gate import once_each

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _debounced_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test project's debounced tasks, here and in the workers started here."""
    monkeypatch.setenv("FUNNEL_TEST_DEBOUNCE", "1")


def test_a_task_id_given_opens_the_window_and_is_the_runs_id(
    standalone_url: str, on_broker: Celery
) -> None:
    """Three sends of key "k" from this process, each after the previous window ran,
    each with ``task_id=X``: the result's id is X and the run's ``request.id`` is X,
    with that send's arguments. Before the fix the first worked, but a process that had
    sent the key before used the id it remembered, then (that window had run) dropped
    the caller's id for a new one: the result returned was not X, and an
    ``AsyncResult(X)`` kept by the caller stayed PENDING."""
    task = on_broker.tasks["proj.debounced"]
    given: list[str] = []
    for n in range(3):
        given.append(f"given-{n}-{uuid.uuid4()}")
        result = task.apply_async(("k", n), task_id=given[-1])
        assert result.id == given[-1], f"send {n}"
        assert result.get(timeout=30) == n
        assert on_broker.AsyncResult(given[-1]).state == states.SUCCESS
    recorded = once_each(standalone_url, "proj.debounced", set(given))
    assert sorted((r["id"], r["args"]) for r in recorded) == sorted(
        (task_id, ["k", n]) for n, task_id in enumerate(given)
    )


def test_a_group_of_debounced_tasks_sent_twice_completes_both_times(
    standalone_url: str, on_broker: Celery
) -> None:
    """A group of debounced tasks on keys a, b, c, sent, waited for, and sent again from
    the same process: both times every member ends SUCCESS with its own send's value.
    A group gives each member its id (``task_id``) and waits for that id. Before the
    fix the second group's sends used the ids this process remembered for the keys'
    (finished) windows, then fresh ones: the members' ids never ran, they stayed
    PENDING and ``group.get()`` never returned."""
    task = on_broker.tasks["proj.debounced"]
    sent: set[str] = set()
    for n in range(2):
        result = group(task.s(key, n) for key in "abc").delay()
        assert result.get(timeout=60) == [n, n, n], f"group {n}"
        assert [member.state for member in result.results] == [states.SUCCESS] * 3
        sent |= {member.id for member in result.results}
    assert len(sent) == 6
    recorded = once_each(standalone_url, "proj.debounced", sent)
    assert sorted((r["args"][0], r["args"][1]) for r in recorded) == [
        (key, n) for key in "abc" for n in range(2)
    ]


@pytest.fixture
def forgetful() -> Iterator[RedisServer]:
    """A funnels' Redis without an append-only file."""
    with RedisServer() as server:
        yield server


@pytest.mark.parametrize("why", ["no AOF", "funnel_park=False"])
def test_a_debounced_send_that_could_be_lost_is_refused_at_send_time(
    broker: RedisServer, forgetful: RedisServer, standalone_url: str, why: str
) -> None:
    """A producer's debounced send to a funnels' Redis without an append-only file (a
    restart would lose it), or under ``funnel_park=False`` (no releaser would publish
    it), raises the ConfigurationError a worker gives at start, and stores and
    publishes nothing. Before the fix the send was stored and returned a result: it was
    lost at the Redis's restart, or never released."""
    if why == "no AOF":
        app = make_app(broker.url, forgetful.url)
        url = forgetful.url
        expected = (
            "task 'proj.debounced': funnel_debounce=1 keeps each key's last send in the"
            " funnels' Redis, which has no append-only file and is not the broker's Redis"
            " server (a restart would lose them): turn on 'appendonly yes', or keep the"
            " funnels on the broker's Redis"
        )
    else:  # a funnels' Redis with AOF
        app = make_app(broker.url, standalone_url, funnel_park=False)
        url = standalone_url
        expected = (
            "task 'proj.debounced': funnel_debounce=1 needs funnel_park (the workers'"
            " releasers publish debounced runs); funnel_park=False"
        )
    try:
        with pytest.raises(ConfigurationError) as raised:
            app.tasks["proj.debounced"].delay("k", 0)
        assert str(raised.value) == expected
        with redis.Redis.from_url(url) as client:
            assert ParkStore(client, "funnel:").count() == 0
            assert list(client.scan_iter("funnel:*")) == []
        with redis.Redis.from_url(broker.url) as client:
            assert list(client.scan_iter("proj*")) == []  # nothing published
    finally:
        close_app(app)
    assert runs(url) == []
