"""The releaser (``releaser.Releaser``) built by hand, its ticks called one by one: the
parked tasks in one private Redis, the broker another, whose queue kombu counts. A tick
publishes each due task once and forgets it: nothing stays parked, and no later tick,
once the tick's claim has lapsed, publishes it again."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_funnel._celery.releaser import Releaser
from celery_funnel._stores.park import ParkStore, capture
from celery_funnel.testing import RedisServer
from tests.integration.proj import close_app, make_app
from tests.polling import wait_for

pytestmark = pytest.mark.redis
QUEUE = "proj"  # make_app's default queue
LEASE = 0.2  # seconds a tick's claim lasts: short, so that the test sees it lapse


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    """A broker of the test's own: its queue holds only what the releaser published."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def app(standalone_url: str, broker: RedisServer) -> Iterator[Celery]:
    app = make_app(broker.url, standalone_url, queue=QUEUE)
    yield app
    close_app(app)


@pytest.fixture
def client(standalone_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(standalone_url)
    yield client
    client.close()


def queued(app: Celery) -> int:
    """Messages waiting in the broker's queue, as kombu counts them (every priority)."""
    with app.connection_for_read() as connection:
        return int(connection.default_channel.queue_declare(queue=QUEUE).message_count)


def queued_ids(app: Celery) -> list[str]:
    """The task ids of the messages in the broker's queue (taken off it)."""
    ids: list[str] = []
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(QUEUE, no_ack=True)) is not None:
            ids.append(message.headers["id"])
    return ids


def park(app: Celery, store: ParkStore, n: int) -> str:
    """Park a run of ``proj.plain`` due now; its task id."""
    signature = app.tasks["proj.plain"].s(n).set(task_id=uuid.uuid4().hex)
    meta = {"task": "proj.plain", "funnel": "f", "priority": None, "parked_at": time.time()}
    assert store.park(signature.id, 0.0, capture(signature, meta), "")
    return str(signature.id)


def server_now(client: redis.Redis) -> float:
    """The Redis server's clock (the one claims run on), epoch seconds."""
    seconds, microseconds = client.time()
    return float(seconds) + microseconds / 1_000_000


def test_a_tick_publishes_a_due_task_once_and_forgets_it(app: Celery, client: redis.Redis) -> None:
    """One tick: one copy in the broker, nothing parked. Ticks after the claim lapsed
    find nothing: still one copy, nothing parked (without the tick's ``done`` the entry
    stayed parked, and the first tick after the lapse published a second copy)."""
    store = ParkStore(client, "funnel:")
    task_id = park(app, store, 0)
    releaser = Releaser(app, store, lease=LEASE, lead=0.0)
    assert queued(app) == 0
    claimed_at = server_now(client)
    releaser.tick()
    first = (queued(app), store.count())  # (copies in the broker, tasks parked)
    wait_for(lambda: server_now(client) > claimed_at + LEASE, 5)  # the claim has lapsed
    releaser.tick()
    releaser.tick()
    lapsed = (queued(app), store.count())
    assert (first, lapsed) == ((1, 0), (1, 0)), "(copies, parked) after one tick, after more"
    assert queued_ids(app) == [task_id]


def test_a_tick_publishes_each_of_several_due_tasks_once(app: Celery, client: redis.Redis) -> None:
    """Five due tasks, one tick: five copies, one of each, nothing parked; the same
    after the claim lapsed."""
    store = ParkStore(client, "funnel:")
    ids = [park(app, store, n) for n in range(5)]
    releaser = Releaser(app, store, lease=LEASE, lead=0.0)
    claimed_at = server_now(client)
    releaser.tick()
    first = (queued(app), store.count())
    wait_for(lambda: server_now(client) > claimed_at + LEASE, 5)
    releaser.tick()
    assert (first, (queued(app), store.count())) == ((5, 0), (5, 0))
    assert sorted(queued_ids(app)) == sorted(ids)
