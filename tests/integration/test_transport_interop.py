"""The broker transport beside kombu's own, with real workers on one Redis broker: the
order a worker takes messages in (priority steps, queues in turn) is kombu's; a stock
producer's tasks reach our workers (the fallback poll, they push no marker); stock and
our workers share a queue; a rollback to kombu's transport restores what ours left
un-acked; and Sentinel."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from celery_funnel._transport.fetch import FETCH
from celery_funnel.testing import RedisServer
from tests.integration.transport_proj import TransportConf, counts, runs
from tests.integration.transport_rig import held, producer, restoring, visible, workers
from tests.polling import wait_for
from tests.servers import SentinelServers

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def store() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


def ran_once(store: str, ids: list[str], timeout: float = 90.0) -> None:
    wait_for(lambda: set(counts(store)) >= set(ids), timeout)
    assert {task: n for task, n in counts(store).items() if n > 1} == {}


def order_taken(broker: RedisServer, store: str, ours: bool) -> list[tuple[str, int]]:
    """Messages of priorities 9, 0, 5, 0, 3 in queues a and b, sent before any worker;
    then one worker (solo pool, one message at a time) takes them: (queue, n) in the
    order they ran."""
    conf = TransportConf(broker.url, store, ours=ours, queues=("a", "b"), prefetch=1)
    with redis.Redis.from_url(store) as client:
        client.flushall()
    with producer(conf) as app:
        for queue in ("a", "b"):
            for n, priority in enumerate((9, 0, 5, 0, 3)):
                app.send_task("transport.record", (n,), queue=queue, priority=priority)
        with workers(conf, 1, "-P", "solo"):
            wait_for(lambda: len(runs(store)) == 10, 60)
    return [(str(run["queue"]), int(run["n"])) for run in runs(store)]


def test_the_order_is_kombus(broker: RedisServer, store: str) -> None:
    """Priority 0 first (kombu's step 0 is the highest), then step 3 (priorities 3 to 5)
    and step 9, FIFO within a list, the two queues in turn: as kombu's transport, in
    the same run."""
    stock = order_taken(broker, store, ours=False)
    ours = order_taken(broker, store, ours=True)
    for taken in (stock, ours):
        assert [n for _, n in taken] == [1, 1, 3, 3, 2, 2, 4, 4, 0, 0]
        queues = [q for q, _ in taken]  # in turn, from where the cycle starts
        assert queues == [queues[0], queues[1]] * 5
    # where the cycle starts is the consumer's (kombu 5.7: the same for both; 5.3 may
    # start the other way round)
    assert ours in (stock, [({"a": "b", "b": "a"}[q], n) for q, n in stock])


def test_a_stock_producer_reaches_our_workers(broker: RedisServer, store: str) -> None:
    """A producer on kombu's transport pushes no marker: our workers find its tasks at
    their fallback poll (every brpop_timeout), and run each once."""
    ours = TransportConf(broker.url, store)
    stock = TransportConf(broker.url, store, ours=False)
    with workers(ours, 2), producer(stock) as app:
        ids = [app.send_task("transport.record", (n,)).id for n in range(30)]
        ran_once(store, ids)
        wait_for(lambda: held(broker.url) == 0)


def test_stock_and_our_workers_share_a_queue(broker: RedisServer, store: str) -> None:
    """Workers of both transports consume one queue, producers of both send to it:
    every task runs once, and both kinds of worker ran some."""
    ours = TransportConf(broker.url, store, options=restoring(30))
    stock = TransportConf(broker.url, store, ours=False, options=restoring(30))
    with (
        workers(ours, 1, prefix="ours"), workers(stock, 1, prefix="stock"),
        producer(ours) as mine, producer(stock) as theirs,
    ):  # fmt: skip
        ids = [(mine if n % 2 else theirs).send_task("transport.record", (n, 0.02)).id
               for n in range(60)]  # fmt: skip
        ran_once(store, ids)
    assert {str(run["worker"]).split("1@")[0] for run in runs(store)} == {"ours", "stock"}


def test_a_rollback_to_kombus_transport_restores_what_ours_left(
    broker: RedisServer, store: str
) -> None:
    """Our worker (one process, prefetching 4) takes and records a long run and three
    more messages, the fifth stays queued, and it is SIGKILLed; the setting is removed:
    a worker on kombu's transport restores them from ``unacked`` after the visibility
    timeout and runs each once."""
    # the long run (3 s) is killed; run again, it ends within the visibility timeout (5 s)
    ours = TransportConf(broker.url, store, acks_late=True, options=restoring(5))
    stock = TransportConf(broker.url, store, ours=False, acks_late=True, options=restoring(5))
    with producer(ours) as app:
        with workers(ours, 1, "-c", "1") as killed:
            ids = [app.send_task("transport.record", (0, 3)).id]
            ids += [app.send_task("transport.record", (n,)).id for n in range(1, 5)]
            with redis.Redis.from_url(broker.url) as client:
                wait_for(lambda: client.hlen("unacked") == 4, 30)
            for process in killed.processes:
                process.kill()
        assert counts(store) == {}
        visible(broker.url, 5)
        with workers(stock, 1, "-c", "2", prefix="stock"):
            ran_once(store, ids[1:])
            wait_for(lambda: set(counts(store)) == set(ids), 90)
    assert {task: n for task, n in counts(store).items() if n > 1} == {}


@pytest.fixture
def sentinel() -> Iterator[SentinelServers]:
    servers = SentinelServers().start()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.mark.skipif(
    redis.VERSION < (5, 0, 1),
    reason="redis-py 5.0.0's Sentinel connections cannot read pub/sub (push_request): "
    "kombu's own transport fails the same",
)
def test_sentinel(sentinel: SentinelServers, store: str) -> None:
    """``sentinel://`` with the Sentinel transport: tasks run once, recorded on the
    master the Sentinel names."""
    url = f"sentinel://127.0.0.1:{sentinel.sentinel.port}"
    conf = TransportConf(url, store, options={"master_name": sentinel.sentinel.service})
    with producer(conf) as app, workers(conf, 2):
        ids = [app.send_task("transport.record", (n,)).id for n in range(20)]
        ran_once(store, ids)
        assert app.control.ping(timeout=5)
    with redis.Redis(port=sentinel.master_port()) as master:
        assert master.hlen("unacked") == 0
        assert master.script_exists(FETCH.sha) == [True]  # our fetch took them
