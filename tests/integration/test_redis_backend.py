"""What only a real Redis can show: key expiry, NOSCRIPT recovery, errors, the clock."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from celery_funnel import BackendError, ConfigurationError, RedisFunnel
from celery_funnel.testing import RedisServer
from tests.polling import wait_for

pytestmark = pytest.mark.redis


def test_funnel_key_expires_when_the_funnel_is_idle_again(
    redis_funnel: RedisFunnel, redis_client: redis.Redis, key: str
) -> None:
    decision = redis_funnel.throttle(key, 1, 10, 1)  # server clock; 2 units of 0.1 s
    ttl_ms = redis_client.pttl(key)
    assert 0 < ttl_ms <= 100
    assert decision.reset_after == pytest.approx(0.1, abs=1e-6)
    wait_for(lambda: not redis_client.exists(key), timeout=5)


def test_script_is_reloaded_after_script_flush(
    redis_funnel: RedisFunnel, redis_client: redis.Redis, key: str
) -> None:
    redis_funnel.throttle(key, 5, 1, 1)
    redis_client.script_flush()
    assert redis_funnel.throttle(key, 5, 1, 1).remaining == 4


def test_server_time_is_the_clock(
    redis_funnel: RedisFunnel, redis_client: redis.Redis, key: str
) -> None:
    """Without now=, TATs are the server's TIME, not this process's clock."""
    redis_funnel.throttle(key, 0, 1, 60)
    seconds, micros = redis_client.time()
    tat_us = int(redis_client.get(key) or 0)
    assert abs(tat_us - (seconds * 1_000_000 + micros + 60_000_000)) < 1_000_000


def test_unreachable_redis_raises_backend_error_quickly() -> None:
    with RedisServer() as server:
        funnel = RedisFunnel.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        server.kill()
        start = time.monotonic()
        with pytest.raises(BackendError, match="gcra") as info:
            funnel.throttle("k", 0, 1, 1)
        assert isinstance(info.value.__cause__, redis.RedisError)
        assert time.monotonic() - start < 5


def test_bad_url() -> None:
    with pytest.raises(ConfigurationError, match="ftp://x"):
        RedisFunnel.from_url("ftp://x")


def test_reset_removes_every_key_of_a_funnel(
    redis_funnel: RedisFunnel, redis_client: redis.Redis, key: str
) -> None:
    redis_funnel.throttle(key, 0, 1, 3600)
    redis_funnel.reserve(key, 0, 1, 3600, ticket="t")
    window = f"{key}:window"
    redis_funnel.sliding_window(window, 1, 60, windows=3)
    assert len(redis_client.keys(f"*{key}*")) == 3  # a sliding window is one key
    redis_funnel.reset(key)
    redis_funnel.reset(window)
    assert redis_client.keys(f"*{key}*") == []


def test_decisions_go_on_after_redis_restarts_on_the_same_port() -> None:
    """The decision path keeps a connection of its own: when the server goes away and
    comes back, the next decision reconnects instead of failing on a dead socket."""
    server = RedisServer().start()
    try:
        funnel = RedisFunnel.from_url(server.url, socket_timeout=2)
        assert not funnel.throttle("k", 5, 10, 1).limited
        server.kill()
        with pytest.raises(BackendError):
            funnel.throttle("k", 5, 10, 1)
        server.start()
        assert funnel.throttle("k", 5, 10, 1).remaining == 5, "a fresh server: a fresh funnel"
        funnel.client.close()
    finally:
        server.stop()


def test_a_forked_child_decides_on_a_connection_of_its_own(redis_url: str) -> None:
    """A prefork pool child inherits its parent's funnel: it must not share the
    parent's socket (replies would cross), so each process takes its own connection."""
    funnel = RedisFunnel.from_url(redis_url, socket_timeout=5)
    key = f"fork:{os.getpid()}:{time.time()}"
    assert funnel.throttle(key, 100, 1, 3600).remaining == 100  # the parent's connection
    children = [_fork_deciding(funnel, key, 5) for _ in range(4)]
    remaining = [n for child in children for n in _answers(*child)]
    assert sorted(remaining, reverse=True) == list(range(99, 79, -1)), "each taken once"
    assert funnel.throttle(key, 100, 1, 3600).remaining == 79, "the parent's still works"
    funnel.client.close()


def _fork_deciding(funnel: RedisFunnel, key: str, times: int) -> tuple[int, int]:
    """A forked child that takes ``times`` units and writes what remained after each."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no cleanup of the parent's objects, ever
        code = 1
        try:
            answers = [funnel.throttle(key, 100, 1, 3600).remaining for _ in range(times)]
            os.write(write, " ".join(map(str, answers)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


def _answers(pid: int, read: int) -> list[int]:
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return [int(n) for n in text.split()]


def test_threads_deciding_at_once_each_get_their_own_answer(redis_url: str) -> None:
    """One thread at a time uses the decision connection; the others go through the
    client's pool: no reply reaches the wrong caller."""
    funnel = RedisFunnel.from_url(redis_url, socket_timeout=5)
    key = f"threads:{os.getpid()}:{time.time()}"
    with ThreadPoolExecutor(8) as pool:
        remaining = list(
            pool.map(lambda _: funnel.throttle(key, 399, 1, 3600).remaining, range(400))
        )
    assert sorted(remaining) == list(range(400)), "each unit taken once, each answer its own"
    funnel.client.close()
