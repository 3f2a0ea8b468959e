"""Redis Cluster and Sentinel, on real servers the fixtures start: every limiter works
on a 3-master cluster (the table and property tests run there too, as backend
``cluster``), Celery tasks run through a cluster URL and a cluster client object, and
every limiter keeps its state across a Sentinel failover, through ``redis+sentinel://``."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

from celery_funnel import AsyncRedisFunnel, BackendError, Funnel, RedisFunnel, Shape
from celery_funnel._config.runtime import runtime_for
from celery_funnel._limiter.errors import ConfigurationError
from celery_funnel._stores.check import check
from celery_funnel._stores.persistence import Persistence, aof_everywhere, read_persistence
from tests.conftest import CLUSTER, ServerPool
from tests.integration.proj import close_app, make_app, runs
from tests.integration.test_one_gate import workers
from tests.polling import wait_for
from tests.servers import RedisClusterServers, SentinelServers

pytestmark = [
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.skipif(not CLUSTER, reason="needs private redis-servers and redis-cli"),
]
HOUR = 3600.0
# A fixed window is aligned on the epoch: on Redis's clock, an hour's window ends on the
# hour, and a test running across it sees the next window admit (load run 2 of
# 2026-12-08, 00:52-01:10 UTC: "fixed_window: the new master holds the funnel"). Its
# calls name a time at the start of a window instead: the funnel's state is under test.
WINDOW_START = 1_800_000_000.0  # 500 000 hours since the epoch

# Every limiter at one unit per hour: True when it admits. Keys holding several Redis
# keys (tickets, window counters, joint funnels) must keep them in one cluster slot.
LIMITERS: dict[str, Callable[[Funnel, str], bool]] = {
    "gcra": lambda f, k: f.throttle(k, 0, 1, HOUR).allowed,
    "reserve": lambda f, k: f.reserve(k, 0, 1, HOUR, ticket=uuid.uuid4().hex).admitted,
    "reserve_all": lambda f, k: (
        f.reserve_all(
            [Shape(f"{{{k}}}:a", 0, 1, HOUR), Shape(f"{{{k}}}:b", 0, 2, HOUR)],
            ticket=uuid.uuid4().hex,
        ).admitted
    ),
    "fixed_window": lambda f, k: f.fixed_window(k, 1, HOUR, now=WINDOW_START).allowed,
    "sliding_window": lambda f, k: f.sliding_window(k, 1, HOUR).allowed,
    "sliding_log": lambda f, k: f.sliding_log(k, 1, HOUR).allowed,
}


def retrying(call: Callable[[], bool], timeout: float = 30.0) -> tuple[bool, int]:
    """``call()``, retried while the backend fails (a failover in progress): its answer
    and the failures seen. Never a silent wrong answer: a failure is an error."""
    answers: list[bool] = []
    failures = 0

    def attempt() -> bool:
        nonlocal failures
        try:
            answers.append(call())
        except BackendError:
            failures += 1
            return False
        return True

    wait_for(attempt, timeout)
    return answers[0], failures


@pytest.fixture(scope="module")
def sentinel_servers() -> Iterator[SentinelServers]:
    servers = SentinelServers().start()
    yield servers
    servers.stop()


def test_every_limiter_keeps_its_state_across_a_sentinel_failover(
    sentinel_servers: SentinelServers,
) -> None:
    funnel = RedisFunnel.from_url(sentinel_servers.url)
    keys = {name: f"failover:{name}:{uuid.uuid4().hex}" for name in LIMITERS}
    for name, call in LIMITERS.items():
        assert call(funnel, keys[name]), f"{name}: the first unit is admitted"
        assert not call(funnel, keys[name]), f"{name}: the second is refused"
    first_master = sentinel_servers.master_port()
    sentinel_servers.failover()
    assert sentinel_servers.master_port() != first_master
    failures = 0
    for name, call in LIMITERS.items():
        admitted, failed = retrying(partial(call, funnel, keys[name]))
        failures += failed
        assert not admitted, f"{name}: the new master holds the funnel, the limit holds"
        assert call(funnel, f"{keys[name]}-new"), f"{name}: new funnels work"
    assert failures <= 2, "one reconnection, not a stream of errors"
    funnel.client.close()


@pytest.mark.anyio
async def test_an_async_funnel_keeps_its_funnels_across_a_sentinel_failover(
    sentinel_servers: SentinelServers,
) -> None:
    key = f"failover:async:{uuid.uuid4().hex}"
    async with AsyncRedisFunnel.from_url(sentinel_servers.url) as funnel:
        assert not (await funnel.throttle(key, 0, 1, HOUR)).limited
        first_master = sentinel_servers.master_port()
        sentinel_servers.failover()
        assert sentinel_servers.master_port() != first_master
        deadline, failures = time.monotonic() + 30, 0
        while True:  # a failover in progress fails calls for a moment, never answers wrong
            try:
                decision = await funnel.throttle(key, 0, 1, HOUR)
                break
            except BackendError:
                failures += 1
                assert time.monotonic() < deadline, "the new master never answered"
                await asyncio.sleep(0.05)
        assert decision.limited, "the new master holds the funnel"
        assert failures <= 2, "one reconnection, not a stream of errors"
        assert not (await funnel.throttle(f"{key}-new", 0, 1, HOUR)).limited


def test_celery_tasks_share_funnels_through_a_sentinel_url(
    sentinel_servers: SentinelServers, broker_url: str
) -> None:
    app: Celery = make_app(broker_url, broker_url, task_ignore_result=True)
    app.conf.funnel_redis_url = sentinel_servers.url
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        for i in range(4):
            app.tasks["proj.limited"].delay(i)
        wait_for(lambda: len(runs(broker_url)) >= 4, 30)
    recorded = runs(broker_url)
    assert sorted(r["args"][0] for r in recorded) == [0, 1, 2, 3]
    assert sum(r["deferrals"] for r in recorded) >= 2, "the funnel refused some"
    pool = runtime_for(app).funnel.client.connection_pool  # type: ignore[attr-defined]
    assert isinstance(pool, SentinelConnectionPool), "decided on the Sentinel's master"
    close_app(app)


def test_sentinel_url_must_name_the_service() -> None:
    with pytest.raises(ConfigurationError, match="redis\\+sentinel://host:port"):
        RedisFunnel.from_url("redis+sentinel://127.0.0.1:26379")
    with pytest.raises(ConfigurationError, match="host:port"):
        RedisFunnel.from_url("redis+cluster://no-port")


@pytest.fixture
def cluster_url(server_pool: ServerPool) -> str:
    return server_pool.cluster_url()


@pytest.fixture
def broker_url(standalone_url: str) -> str:
    """The broker and the run records (the funnels are elsewhere)."""
    return standalone_url


@pytest.mark.parametrize("form", ["url", "client"])
def test_celery_tasks_share_funnels_on_a_cluster(
    cluster_url: str, broker_url: str, form: str
) -> None:
    target: Any = cluster_url
    if form == "client":
        nodes = cluster_url.removeprefix("redis+cluster://").split(",")
        host, port = nodes[0].split(":")
        target = RedisCluster(host=host, port=int(port))
    app: Celery = make_app(broker_url, broker_url, task_ignore_result=True)
    app.conf.funnel_redis_url = target
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        for i in range(3):
            app.tasks["proj.two_limits"].delay("acme", i)  # two limits: one script, one slot
            app.tasks["proj.per_customer"].delay(f"c{i}", i)
            app.tasks["proj.limited"].delay(i)
        wait_for(lambda: len(runs(broker_url)) >= 9, 30)
    recorded = runs(broker_url)
    assert len(recorded) == 9, recorded
    assert sorted({r["name"] for r in recorded}) == [
        "proj.limited", "proj.per_customer", "proj.two_limits"
    ]  # fmt: skip
    assert sum(r["deferrals"] for r in recorded) >= 2, "the funnels refused some"
    close_app(app)
    if form == "client":
        target.close()


def test_funnels_spread_over_the_masters_and_each_keeps_one_slot(cluster_url: str) -> None:
    funnel = RedisFunnel.from_url(cluster_url)
    assert isinstance(funnel.client, RedisCluster)
    prefix = f"spread:{uuid.uuid4().hex}"
    for n in range(30):
        for name, call in LIMITERS.items():
            call(funnel, f"{prefix}:{name}:{n}")
            call(funnel, f"{prefix}:{name}:{n}")  # refused: tickets and counters too
    nodes = funnel.client.get_primaries()
    holding = 0
    slots_by_funnel: dict[str, set[int]] = {}
    for node in nodes:
        with redis.Redis(host=node.host, port=node.port) as client:
            found = [k.decode() for k in client.scan_iter(f"*{prefix}*", count=1000)]
            holding += bool(found)
            for key in found:
                # spread:<hex>:<limiter>:<n>[:<companion>], hash tags aside
                funnel_name = ":".join(
                    key.split("#")[0].replace("{", "").replace("}", "").split(":")[:4]
                )
                slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
                slots_by_funnel.setdefault(funnel_name, set()).add(slot)
    assert holding == len(nodes) == 3, "funnels live on every master"
    assert slots_by_funnel
    assert all(len(slots) == 1 for slots in slots_by_funnel.values()), slots_by_funnel
    funnel.client.close()


@pytest.fixture
def partly_persistent_cluster() -> Iterator[RedisClusterServers]:
    """A cluster of its own (3 masters) whose first two masters have an append-only
    file and whose third has none (the first, slot 0's, is the node redis-py sends a
    command for no key to: it has AOF)."""
    cluster = RedisClusterServers(3).start()
    try:
        for server in cluster.servers[:2]:
            appendonly(server.port)
        yield cluster
    finally:
        cluster.stop()


def appendonly(port: int) -> None:
    """Turn AOF on at one node (``CONFIG SET``), and wait for its first rewrite."""
    with redis.Redis(port=port, decode_responses=True) as node:
        node.config_set("appendonly", "yes")
        wait_for(lambda: node.info("persistence")["aof_rewrite_in_progress"] == 0, 30)
        assert node.info("persistence")["aof_enabled"] == 1


def test_a_cluster_parks_only_when_every_master_has_aof(
    partly_persistent_cluster: RedisClusterServers, standalone_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Two of three masters with AOF: the cluster is said to have none (a parked task
    on the third would be lost on its restart): nothing is parked, ``funnel_park=True``
    stops the worker, ``check`` says so, and a worker with a debounced task refuses to
    start. The third master's AOF turned on too, parking starts."""
    cluster = partly_persistent_cluster
    funnel = RedisFunnel.from_url(cluster.url)
    app = make_app(standalone_url, cluster.url, store_url=standalone_url)
    try:
        assert not aof_everywhere(funnel.client)
        assert read_persistence(funnel.client)[0] is False
        assert runtime_for(app).persistence.keeps() is False  # funnel_park="auto"
        with pytest.raises(ConfigurationError, match="has no append-only file"):
            Persistence(lambda: funnel.client, True).start()
        found = {f.topic: f for f in check(funnel, "funnel:", parking=True)}
        assert found["persistence"].level == "error", found
        assert "no append-only file" in found["persistence"].message
        monkeypatch.setenv("FUNNEL_TEST_DEBOUNCE", "1")
        started = workers(standalone_url, cluster.url, 1, FUNNEL_TEST_STORE=standalone_url)
        started.start()
        try:
            wait_for(lambda: started.processes[0].poll() is not None, 60)
            logs = started.logs()
        finally:
            started.stop()
        assert "task 'proj.debounced': funnel_debounce=1 keeps each key's last send" in logs
        appendonly(cluster.servers[2].port)  # every master now
        assert aof_everywhere(funnel.client)
        assert Persistence(lambda: funnel.client, "auto").keeps() is True
        assert "persistence" not in {f.topic for f in check(funnel, "funnel:", parking=True)}
    finally:
        close_app(app)
        funnel.client.close()
