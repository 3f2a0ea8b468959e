"""The releaser (``releaser.Releaser``) built by hand, its ticks called one by one: the
parked tasks in one private Redis, the broker another, whose queue kombu counts. A tick
publishes each due task once; the entry stays until a worker accepts the copy (here:
``accept``, as the gate does), and no later tick publishes it again. A copy no worker
accepted before the claim lapsed (it may have been lost on its way) is published again,
and the first copy accepted is the one that runs."""

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


def test_a_tick_publishes_a_due_task_once_and_forgets_it_when_accepted(
    app: Celery, client: redis.Redis
) -> None:
    """One tick: one copy in the broker, the entry kept until a worker accepts the copy;
    ticks after the claim lapsed find nothing: still one copy, nothing parked."""
    store = ParkStore(client, "funnel:")
    task_id = park(app, store, 0)
    releaser = Releaser(app, store, lease=LEASE, lead=0.0)
    assert queued(app) == 0
    releaser.tick()
    claimed_by = server_now(client)  # the claim was made by then
    first = (queued(app), store.count())  # (copies in the broker, tasks parked)
    (token,) = [message_token(app)]
    assert store.accept(task_id, token), "the worker that receives it accepts it"
    wait_for(lambda: server_now(client) > claimed_by + LEASE, 5)  # the claim has lapsed
    releaser.tick()
    releaser.tick()
    lapsed = (queued(app), store.count())
    assert (first, lapsed) == ((1, 1), (1, 0)), "(copies, parked) after one tick, after more"
    assert queued_ids(app) == [task_id]


def test_a_copy_no_worker_accepted_is_published_again_and_one_runs(
    app: Celery, client: redis.Redis
) -> None:
    """The copy of a release that no worker accepted within the claim (lost on its
    way, or still queued) is published again; of the two, the first accepted runs."""
    store = ParkStore(client, "funnel:")
    task_id = park(app, store, 0)
    releaser = Releaser(app, store, lease=LEASE, lead=0.0)
    releaser.tick()
    claimed_by = server_now(client)  # the claim was made by then
    wait_for(lambda: server_now(client) > claimed_by + LEASE, 5)
    releaser.tick()
    assert (queued(app), store.count()) == (2, 1)
    first, second = message_tokens(app)
    assert first != second
    assert store.accept(task_id, second), "the later copy happened to come first: it runs"
    assert not store.accept(task_id, first), "the other is dropped"
    assert store.count() == 0


def message_token(app: Celery) -> str:
    """The release token of the first message in the broker's queue (left there)."""
    with app.connection_for_read() as connection:
        message = connection.default_channel.basic_get(QUEUE)
        assert message is not None
        message.requeue()
        return str(message.headers["celery_funnel"]["release"])


def message_tokens(app: Celery) -> list[str]:
    """The release tokens of the messages in the broker's queue (taken off it), in
    publish order."""
    tokens: list[str] = []
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(QUEUE)) is not None:
            message.ack()
            tokens.append(str(message.headers["celery_funnel"]["release"]))
    return tokens[::-1]


def test_a_tick_publishes_each_of_several_due_tasks_once(app: Celery, client: redis.Redis) -> None:
    """Five due tasks, one tick: five copies, one of each; accepted, nothing stays
    parked, and the same after the claim lapsed."""
    store = ParkStore(client, "funnel:")
    ids = [park(app, store, n) for n in range(5)]
    releaser = Releaser(app, store, lease=LEASE, lead=0.0)
    releaser.tick()
    claimed_by = server_now(client)  # the claim was made by then
    first = queued(app)
    for task_id in ids:
        assert store.accept(task_id, client_token(client, task_id))
    wait_for(lambda: server_now(client) > claimed_by + LEASE, 5)
    releaser.tick()
    assert (first, (queued(app), store.count())) == (5, (5, 0))
    assert sorted(queued_ids(app)) == sorted(ids)


def client_token(client: redis.Redis, task_id: str) -> str:
    """The token of the release in flight of ``task_id`` (its claim)."""
    claims = ParkStore(client, "funnel:").keys[2]
    token = client.hget(claims, task_id)
    assert isinstance(token, bytes)
    return token.decode()
