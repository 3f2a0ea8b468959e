"""``funnel.limit`` on real Redis: every store alike, coroutines and processes sharing
one limit at its rate, and a function sharing a funnel with a Celery task."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import threading
import time
import uuid
from typing import Any

import pytest
from celery import Celery

from celery_funnel import (
    AsyncRedisFunnel,
    Funnel,
    FunnelTask,
    Limited,
    RedisFunnel,
    install,
)
from celery_funnel._config.runtime import runtime_for
from celery_funnel.testing import peak
from tests.conftest import SERVERS, ServerPool
from tests.redis_monitor import funnel_log, one_slot_each, started_early

ONE_REDIS = True  # the Celery part: one Redis version is enough (tests/conftest.py)


@pytest.mark.anyio
async def test_every_store_raises_skips_and_waits_alike(
    any_funnel: Funnel | AsyncRedisFunnel, key: str
) -> None:
    raising = any_funnel.limit("1/m", name=key, on_limit="raise")
    skipping = any_funnel.limit("1/m", name=key, on_limit="skip")

    @raising
    async def call() -> str:
        return "ran"

    @skipping
    async def maybe() -> str:
        return "ran"

    assert await call() == "ran"
    with pytest.raises(Limited) as info:
        await call()
    assert 59 < info.value.retry_after <= 60
    assert info.value.funnel == f"funnel:{{{key}}}"
    assert await maybe() is None
    block = any_funnel.limit("10/s", name=f"{key}:block")
    # read before the first call is decided (after it, a loaded machine's delay would
    # shorten the wait measured)
    start = time.monotonic()
    async with block:
        pass
    async with block:  # its slot is booked 0.1 s after the first
        assert time.monotonic() - start >= 0.09


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.anyio
async def test_two_hundred_coroutines_start_at_the_funnel_rate(server_pool: ServerPool) -> None:
    """50/s, capacity 5, on_limit="wait": 5 start at once, then one every 20 ms. Read
    from the funnel's own decisions on Redis's clock (``tests.redis_monitor``): each
    call books one slot, 20 ms after the one before once the 5 are taken; the slots
    hold at most 55 in any second; every call ran once, and
    none before its slot. (Start times, on the event loop's clock, add its delays: a
    loaded machine bunched them to 64 in a second.)"""
    starts: list[float] = []
    url = server_pool.url(next(iter(SERVERS)))
    name = f"test:{uuid.uuid4().hex}"
    with funnel_log(url, "") as log:
        async with AsyncRedisFunnel.from_url(url, socket_timeout=5) as funnel:

            @funnel.limit("50/s", capacity=5, name=name)
            async def call() -> None:
                starts.append(time.time())

            await asyncio.gather(*(call() for _ in range(200)))
    tau = 5 * 0.02  # the funnel's tolerance: capacity x T
    writes = [w for w in log.decisions() if name in w.key]
    assert len({w.key for w in writes}) == 1, {w.key for w in writes}
    # a decision may run from max(now, its TAT - tau): when the funnel is full, its slot
    slots = sorted(max(w.at, w.tat - tau) for w in writes)
    print(f"measured: {peak(slots)} slots in a second; {peak(starts)} starts")
    assert len(writes) == len(starts) == 200, "one decision per call, each ran once"
    # each decision one slot of 50/s: from the TAT before, or from its now when a
    # loaded event loop called after the TAT had passed (the script's now is read
    # within its call, at most 5 ms before Redis stamped the write). Was: every move
    # exactly 20 ms after the TAT before (how fast the loop called, not the funnel)
    moved = [round(step * 1e6) for _, step in log.steps(writes[0].key)]
    odd = [step for step in moved if not 15_000 <= step <= 20_002]
    assert odd == [], "each decision one slot of 50/s after the one before or its now"
    assert peak(slots) <= 55
    # none ran before its slot (a load only makes them later): the n-th start comes
    # at or after the n-th slot
    early = [(a, b) for a, b in zip(sorted(starts), slots, strict=True) if a < b - 0.005]
    assert early == [], "a call ran before its slot"


def _call_for(url: str, name: str, users: list[str], barrier: Any, out: Any) -> None:
    """One process: 3 threads call a 5/s-per-user function for 4 s; its start times
    per user go to ``out``."""
    funnel = RedisFunnel.from_url(url)
    starts: dict[str, list[float]] = {user: [] for user in users}

    @funnel.limit("5/s", key="{user}", name=name)
    def fetch(user: str) -> None:
        starts[user].append(time.time())  # list.append: safe across threads

    def caller(first: int) -> None:
        turns = itertools.cycle(users[first:] + users[:first])
        while time.monotonic() < stop:
            fetch(next(turns))

    barrier.wait()
    stop = time.monotonic() + 4.0
    threads = [threading.Thread(target=caller, args=(i % len(users),)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    funnel.client.close()
    out.put(starts)


@pytest.mark.redis
@pytest.mark.slow
def test_threads_in_two_processes_share_a_limit_per_user(server_pool: ServerPool) -> None:
    url, name = server_pool.url(next(iter(SERVERS))), f"test:{uuid.uuid4().hex}"
    users = ["ann", "bob"]
    context = multiprocessing.get_context("spawn")
    barrier, out = context.Barrier(2), context.Queue()
    processes = [
        context.Process(target=_call_for, args=(url, name, users, barrier, out)) for _ in range(2)
    ]
    with funnel_log(url, "") as log:
        for process in processes:
            process.start()
        try:
            got = [out.get(timeout=60) for _ in processes]
        finally:
            for process in processes:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
                    process.join()
    for user in users:
        mine = [got[0][user], got[1][user]]
        starts = sorted(mine[0] + mine[1])
        assert all(mine), f"{user}: both processes called"
        # 4 s at 5/s, plus the calls booked before the end: ~21-25 (a loaded machine
        # calls less often: the count is bounded above only)
        assert len(starts) <= 30, len(starts)
        # read from the funnel's decisions on Redis's clock: one 0.2 s slot a call, at
        # most 6 in any second, no call before its slot. Was: at most 6 starts in any
        # second of the callers' clocks (threads a loaded machine let run late bunch up)
        writes = [w for w in log.decisions() if name in w.key and f":{user}" in w.key]
        assert len({w.key for w in writes}) == 1, {w.key for w in writes}
        slots = one_slot_each(writes, 0.2)
        assert len(slots) == len(starts), f"{user}: one decision per call"
        assert peak(slots) <= 6, f"{user}: 5/s, capacity 1"
        assert started_early(starts, slots, 0.0) == [], f"{user}: a call before its slot"


@pytest.mark.redis
def test_a_function_shares_a_funnel_with_the_task_of_its_name(redis_url: str) -> None:
    """A FunnelTask and a function named alike, with the same key, use one funnel: the
    task's run takes the unit, the function is refused for that user only."""
    app = Celery("shared", broker="memory://", set_as_current=False)
    app.conf.update(funnel_redis_url=redis_url, funnel_throttle_eager=True)
    install(app)
    name = f"shared.call_api.{uuid.uuid4().hex}"

    @app.task(base=FunnelTask, name=name, funnel_rate="1/m", funnel_key="{user}", shared=False)
    def call_api(user: str) -> str:
        return user

    funnel = RedisFunnel.from_url(redis_url)

    @funnel.limit("1/m", key="{user}", name=name, on_limit="raise")
    def call_upstream(user: str) -> str:
        return user

    try:
        assert call_api.apply(("ann",)).get() == "ann"
        with pytest.raises(Limited) as info:
            call_upstream("ann")
        assert info.value.funnel == runtime_for(app).task_key(name, "ann")
        assert call_upstream("bob") == "bob"
    finally:
        funnel.client.close()
        runtime_for(app).close()
        app.close()
