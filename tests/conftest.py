"""Fixtures: private redis-server processes (one per binary found, and a 3-master Redis
Cluster), and funnels over every backend so that one table checks the Lua scripts and
their Python twins alike, standalone and clustered.

``$CELERY_FUNNEL_REDIS_SERVERS`` (binaries separated by ``os.pathsep``) chooses the
servers: ``python3 dev.py servers`` runs the core tables on Redis 6.2, 7.0 and 8.2 and
Valkey 9.1 this way. ``REDIS_URL`` replaces the private servers with an existing one
(its keys are left alone: every test uses keys of its own).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from celery_funnel import AsyncRedisFunnel, Funnel, MemoryFunnel, RedisFunnel
from celery_funnel.testing import RedisServer, find_redis_servers, server_name
from tests.redis_monitor import script_keys
from tests.servers import RedisClusterServers, redis_cli

pytest_plugins = ["tests.leakcheck"]


def _server_ids() -> dict[str, str | None]:
    """Backend id -> redis-server binary (None: REDIS_URL)."""
    if os.environ.get("REDIS_URL"):
        return {"redis-url": None}
    ids: dict[str, str | None] = {}
    for binary in find_redis_servers():
        ids.setdefault(server_name(binary), binary)
    return ids


SERVERS = _server_ids()
# the Lua scripts run on a 3-master Redis Cluster too, where private servers can be made
CLUSTER = ["cluster"] if "redis-url" not in SERVERS and SERVERS and redis_cli() else []


class ServerPool:
    """Starts each private server on first use, stops them all at the end."""

    def __init__(self) -> None:
        self.running: dict[str, RedisServer] = {}
        self.cluster: RedisClusterServers | None = None

    def cluster_url(self) -> str:
        if self.cluster is None:
            self.cluster = RedisClusterServers(3).start()
        return self.cluster.url

    def url(self, server_id: str) -> str:
        binary = SERVERS[server_id]
        if binary is None:
            return os.environ["REDIS_URL"]
        if server_id not in self.running:
            # with an append-only file, as production Redis that keeps parked tasks
            # must be (``funnel_park="auto"`` parks only there)
            self.running[server_id] = RedisServer(binary, aof=True).start()
        return self.running[server_id].url

    def funnel_url(self, backend_id: str) -> str:
        """The Redis of a funnel backend id: a server's, or the cluster's."""
        return self.cluster_url() if backend_id == "cluster" else self.url(backend_id)

    def stop(self) -> None:
        for server in self.running.values():
            server.stop()
        if self.cluster is not None:
            self.cluster.stop()


@pytest.fixture(scope="session")
def server_pool() -> Iterator[ServerPool]:
    pool = ServerPool()
    yield pool
    pool.stop()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_id" in metafunc.fixturenames:
        funnels = "funnel" in metafunc.fixturenames
        ids = ["memory", *SERVERS, *CLUSTER] if funnels else list(SERVERS)
        if getattr(metafunc.module, "ONE_REDIS", False):
            # the Celery layer: its scripts run on every server in the tables and
            # properties; its own behaviour does not depend on the server's version
            ids = [i for i in ids if i != "memory"][:1]
        metafunc.parametrize("backend_id", _params(ids), indirect=True)
    if "any_backend_id" in metafunc.fixturenames:  # every store, blocking and asyncio
        redis_ids = [*SERVERS, *CLUSTER]
        awaited = [f"{ASYNC}{i}" for i in redis_ids]
        only_awaited = "async_funnel" in metafunc.fixturenames
        ids = awaited if only_awaited else ["memory", *redis_ids, *awaited]
        metafunc.parametrize("any_backend_id", _params(ids), indirect=True)


ASYNC = "async-"  # an AsyncRedisFunnel on the Redis named after it


def _params(ids: list[str]) -> list[object]:
    return [pytest.param(i, id=i, marks=[] if i == "memory" else [pytest.mark.redis]) for i in ids]


@pytest.fixture
def backend_id(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def redis_url(backend_id: str, server_pool: ServerPool) -> str:
    """A real Redis: each private server found, or REDIS_URL."""
    return server_pool.url(backend_id)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def declared_keys_only(request: pytest.FixtureRequest, server_pool: ServerPool) -> Iterator[None]:
    """The test's scripts, on its standalone Redis (``backend_id``; the memory twins and
    the cluster are not watched), touch only the keys given to them in KEYS: read from
    what the server ran (``tests.redis_monitor.ScriptKeys``), independent of the static
    check of the scripts' text (``tests/unit/test_lua_keys.py``)."""
    backend = request.getfixturevalue("backend_id") if "backend_id" in request.fixturenames else ""
    if backend in ("", "memory", "cluster") or SERVERS.get(backend) is None:
        yield
        return
    with script_keys(server_pool.url(backend)) as seen:
        yield
    assert seen.calls, "no script ran: nothing was checked"
    assert seen.undeclared == [], f"scripts touched keys not given in KEYS: {seen.undeclared}"


@pytest.fixture
def funnel(backend_id: str, server_pool: ServerPool) -> Iterator[Funnel]:
    """Every backend: the Python twins in memory, and the Lua scripts on each Redis."""
    if backend_id == "memory":
        yield MemoryFunnel()
        return
    backend = RedisFunnel.from_url(server_pool.funnel_url(backend_id), socket_timeout=5)
    yield backend
    backend.client.close()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Tests marked anyio run on asyncio (redis.asyncio's), not on every backend found."""
    return "asyncio"


@pytest.fixture
def any_backend_id(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def any_funnel(
    any_backend_id: str, server_pool: ServerPool
) -> AsyncIterator[Funnel | AsyncRedisFunnel]:
    """Every store: memory, RedisFunnel and AsyncRedisFunnel on each Redis and the
    Cluster (tests marked anyio; await what an AsyncRedisFunnel answers)."""
    if any_backend_id == "memory":
        yield MemoryFunnel()
        return
    backend_id = any_backend_id.removeprefix(ASYNC)
    url = server_pool.funnel_url(backend_id)
    if backend_id == any_backend_id:
        blocking = RedisFunnel.from_url(url, socket_timeout=5)
        yield blocking
        blocking.client.close()
        return
    awaited = AsyncRedisFunnel.from_url(url, socket_timeout=5)
    yield awaited
    await awaited.aclose()


@pytest.fixture
def async_funnel(any_funnel: Funnel | AsyncRedisFunnel) -> AsyncRedisFunnel:
    """An AsyncRedisFunnel on each Redis and the Cluster (tests marked anyio)."""
    assert isinstance(any_funnel, AsyncRedisFunnel)
    return any_funnel


@pytest.fixture
def key() -> str:
    """A key no other test uses."""
    return f"test:{uuid.uuid4().hex}"


@pytest.fixture
def redis_funnel(redis_url: str) -> Iterator[RedisFunnel]:
    """A RedisFunnel on each real Redis (no memory backend)."""
    backend = RedisFunnel.from_url(redis_url, socket_timeout=5)
    yield backend
    backend.client.close()
