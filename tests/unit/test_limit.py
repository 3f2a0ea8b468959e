"""``Funnel.limit`` on the memory funnel: the decorator, the context manager, the
``on_limit`` modes, keys and names, and ``Limited``."""

from __future__ import annotations

import itertools
import pickle
import threading
import time

import pytest
import redis.asyncio

import celery_funnel
from celery_funnel import (
    AsyncRedisFunnel,
    ConfigurationError,
    CostTooHighError,
    FunnelError,
    Limited,
    MemoryFunnel,
)
from celery_funnel._limiter.keys import limit_key, task_key
from celery_funnel.testing import peak


def test_limited_pickles_with_its_retry_after() -> None:
    error = Limited(1.5, "funnel:{api}")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.retry_after, copy.funnel, str(copy)) == (
        Limited, 1.5, "funnel:{api}", str(error),
    )  # fmt: skip
    assert isinstance(copy, FunnelError)
    assert Limited.__module__ == "celery_funnel"
    assert "Limited" in celery_funnel.__all__


def test_raise_admits_up_to_the_capacity_then_raises_limited() -> None:
    funnel = MemoryFunnel()

    @funnel.limit("1/m", capacity=2, on_limit="raise")
    def call(n: int) -> int:
        return n

    assert [call(1), call(2)] == [1, 2]
    with pytest.raises(Limited) as info:
        call(3)
    assert 59 < info.value.retry_after <= 60  # a unit leaks every 60 s
    assert info.value.funnel == task_key("funnel:", f"{__name__}.{call.__qualname__}")
    assert call.__name__ == "call"  # functools.wraps


def test_skip_returns_none_without_calling() -> None:
    funnel, calls = MemoryFunnel(), []

    @funnel.limit("1/m", on_limit="skip")
    def call() -> str:
        calls.append(1)
        return "ran"

    assert [call(), call(), call()] == ["ran", None, None]
    assert len(calls) == 1


def test_a_key_splits_the_funnel_by_argument() -> None:
    funnel = MemoryFunnel()

    @funnel.limit("1/m", key="{user}", name="api", on_limit="raise")
    def fetch(path: str, user: str = "anonymous") -> str:
        return f"{user}:{path}"

    assert fetch("/a", user="ann") == "ann:/a"
    assert fetch("/a", "bob") == "bob:/a"
    assert fetch("/a") == "anonymous:/a"
    with pytest.raises(Limited) as info:
        fetch("/b", user="ann")
    assert info.value.funnel == "funnel:{api:ann}"


def test_a_callable_key_and_cost_take_the_arguments() -> None:
    funnel = MemoryFunnel()

    @funnel.limit(
        "10/m", capacity=10, key=lambda user, size: user.lower(), cost=lambda user, size: size,
        name="upload", on_limit="raise", prefix="app:",
    )  # fmt: skip
    def upload(user: str, size: int) -> int:
        return size

    assert upload("Ann", 6) == 6
    assert upload("ANN", 0) == 0  # cost 0 always runs
    with pytest.raises(Limited, match=r"app:\{upload:ann\}"):
        upload("ann", 5)
    with pytest.raises(CostTooHighError):
        upload("bob", 11)


def test_a_name_shares_the_funnel_of_a_task_or_a_worker_wide_limit() -> None:
    funnel = MemoryFunnel()
    for options, key in (
        ({"name": "limit:emails.*"}, limit_key("funnel:", "emails.*")),
        ({"name": "emails.send", "key": "42"}, task_key("funnel:", "emails.send", "42")),
    ):
        limit = funnel.limit("1/m", on_limit="raise", **options)  # type: ignore[call-overload]
        with limit:
            pass
        with pytest.raises(Limited) as info, limit:
            pass
        assert info.value.funnel == key
    assert task_key("funnel:", "emails.send", "42") == "funnel:{emails.send:42}"


def test_functions_share_a_funnel_by_name() -> None:
    funnel = MemoryFunnel()
    limit = funnel.limit("1/m", name="upstream", on_limit="skip")

    @limit
    def one() -> int:
        return 1

    @limit
    def two() -> int:
        return 2

    assert (one(), two()) == (1, None)


def test_wait_books_slots_in_order_from_several_threads() -> None:
    """10/s, capacity 1: six calls from three threads start a tenth of a second apart."""
    funnel, starts = MemoryFunnel(), []

    @funnel.limit("10/s")
    def call() -> None:
        starts.append(time.monotonic())

    threads = [threading.Thread(target=lambda: [call(), call()]) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    starts.sort()
    assert len(starts) == 6
    # each call sleeps until its slot (0.1 s apart, exact in the funnel's tables); a
    # thread that wakes a few ms late brings the next start that much nearer
    assert min(b - a for a, b in itertools.pairwise(starts)) >= 0.1 - 0.015
    assert peak(starts, window=0.5) <= 5 + 1


def test_wait_longer_than_max_wait_raises_and_books_nothing() -> None:
    funnel = MemoryFunnel()
    limit = funnel.limit("1/m", name="slow", max_wait=1.0)
    with limit:
        pass
    for _ in range(2):  # a booking would push the second retry_after to 120 s
        with pytest.raises(Limited) as info, limit:
            pass
        assert 59 < info.value.retry_after <= 60


def test_a_window_strategy_waits_for_its_retry_after() -> None:
    funnel, starts = MemoryFunnel(), []

    @funnel.limit("2/0.2s", strategy="fixed_window")
    def call() -> None:
        starts.append(time.time())

    for _ in range(3):
        call()
    windows = [int(start / 0.2 + 1e-6) for start in starts]
    assert windows[0] == windows[1] < windows[2]


def test_a_with_block_needs_a_name_and_cannot_be_skipped() -> None:
    funnel = MemoryFunnel()
    with pytest.raises(ConfigurationError, match="name="), funnel.limit("1/s"):
        pass
    with (
        pytest.raises(ConfigurationError, match="skip"),
        funnel.limit("1/s", name="x", on_limit="skip"),
    ):
        pass
    with (
        pytest.raises(ConfigurationError, match="no arguments"),
        funnel.limit("1/s", name="x", key="{user}"),
    ):
        pass
    with funnel.limit("1/m", name="x", key="ann", on_limit="raise"):
        pass
    with (
        pytest.raises(Limited, match=r"\{x:ann\}"),
        funnel.limit("1/m", name="x", key="ann", on_limit="raise"),
    ):
        pass


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"on_limit": "wiat"}, "did you mean 'wait'"),
        ({"max_wait": -1}, "max_wait"),
        ({"capacity": 0}, "capacity"),
        ({"strategy": "leaky"}, "strategy"),
        ({"name": ""}, "name"),
        ({"cost": 3}, "cost"),
    ],
)
def test_bad_arguments_are_refused_when_the_limit_is_built(
    options: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        MemoryFunnel().limit("1/s", **options)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="rate"):
        MemoryFunnel().limit("often")


def test_a_key_field_must_be_a_parameter() -> None:
    limit = MemoryFunnel().limit("1/s", key="{usr}")
    with pytest.raises(ConfigurationError, match=r"'usr'.*did you mean 'user'"):

        @limit
        def fetch(user: str) -> None: ...

    @limit
    def anything(**kwargs: object) -> None: ...


@pytest.mark.anyio
async def test_async_functions_and_blocks_on_a_blocking_funnel() -> None:
    funnel, ran = MemoryFunnel(), []

    @funnel.limit("1/m", key="{n}", on_limit="skip")
    async def call(n: int) -> int:
        ran.append(n)
        return n

    assert [await call(1), await call(1), await call(2)] == [1, None, 2]
    assert ran == [1, 2]
    async with funnel.limit("10/s", name="block"):
        pass
    start = time.monotonic()
    async with funnel.limit("10/s", name="block"):  # waits for the next slot
        assert time.monotonic() - start >= 0.09


@pytest.mark.anyio
async def test_an_async_funnel_refuses_plain_functions_and_with_blocks() -> None:
    client = redis.asyncio.Redis()  # never connects: nothing is sent
    funnel = AsyncRedisFunnel(client)
    with pytest.raises(ConfigurationError, match="plain function"):

        @funnel.limit("1/s")
        def plain() -> None: ...

    with pytest.raises(ConfigurationError, match="with block"), funnel.limit("1/s", name="x"):
        pass
    await funnel.aclose()


def test_the_decorated_type_says_what_a_call_returns() -> None:
    funnel = MemoryFunnel()

    @funnel.limit("10/s", on_limit="raise")
    def waits() -> int:
        return 1

    @funnel.limit("10/s", on_limit="skip")
    def skips() -> int:
        return 1

    sure: int = waits()  # mypy: wait and raise return what the function returns
    maybe: int | None = skips()  # skip may return None
    assert (sure, maybe) == (1, 1)
