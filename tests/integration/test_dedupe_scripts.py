"""The unique and debounce scripts on every Redis found (a Redis Cluster included): a key
claimed once, extended by its holder, freed only by it, renewed in one call, run out;
a debounced key's window opened, joined, bounded, and closed once its run is claimed."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from celery_funnel._limiter.backends.base import Funnel
from celery_funnel._limiter.backends.memory import MemoryFunnel
from celery_funnel._limiter.keys import debounce_key, task_key, unique_key
from celery_funnel._stores.debounce import DebounceStore
from celery_funnel._stores.park import ParkStore
from celery_funnel._stores.unique import UniqueStore
from tests.polling import wait_for


@pytest.fixture
def client(funnel: Funnel) -> Any:
    if isinstance(funnel, MemoryFunnel):
        pytest.skip("Redis scripts")
    client: Any = funnel.client  # type: ignore[attr-defined]
    return client


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


def test_a_unique_key_is_held_by_one_task(client: Any, prefix: str) -> None:
    store = UniqueStore(client)
    a, b = task_key(prefix, "job", "a"), task_key(prefix, "job", "b")
    assert store.claim(a, "t1", 60) == (True, "t1")
    assert store.claim(a, "t2", 60) == (False, "t1")  # held: nothing changes
    assert store.claim(a, "t1", 60) == (True, "t1")  # its holder again: extended
    assert store.claim(b, "t2", 60) == (True, "t2")  # another key
    assert not store.free(a, "t2")  # only its holder frees it
    holder = store.holder(a)
    assert holder is not None
    assert holder[0] == "t1"
    assert 59 < holder[1] <= 60
    assert store.free(a, "t1")
    assert store.holder(a) is None
    assert store.claim(a, "t3", 60) == (True, "t3")
    assert client.ttl(unique_key(a)) > 0  # never a key without an end


def test_renewal_and_a_claim_that_runs_out(client: Any, prefix: str) -> None:
    store = UniqueStore(client)
    keys = [task_key(prefix, "job", part) for part in "ab"]
    for key in keys:
        store.claim(key, f"id-{key[-2]}", 0.3)
    assert store.renew([(keys[0], f"id-{keys[0][-2]}")], 60) == []  # renewed
    assert store.renew([(keys[1], "someone-else")], 60) == [0]  # not its holder
    wait_for(lambda: store.holder(keys[1]) is None, 5)  # not renewed: ran out
    assert store.holder(keys[0]) is not None


def _message(task_id: str, n: int) -> dict[str, Any]:
    return {
        "body": f"[[{n}], {{}}, {{}}]".encode(), "content_type": "application/json",
        "content_encoding": "utf-8", "headers": {"id": task_id, "task": "job"},
        "properties": {}, "priority": None, "exchange": "", "routing_key": "q", "declare": [],
        "meta": {"task": "job", "funnel": "debounce:job", "priority": None,
                 "parked_at": time.time()},
    }  # fmt: skip


def test_a_debounce_window_is_joined_bounded_and_closed(client: Any, prefix: str) -> None:
    store, parked = DebounceStore(client, prefix), ParkStore(client, prefix)
    window = debounce_key(prefix, "job", "a")

    def send(task_id: str, n: int, *, new: bool, most: float | None = None) -> Any:
        return store.send(window, task_id, _message(task_id, n), new=new, wait=30.0,
                          most=most, lead=0.0, keep=60.0)  # fmt: skip

    began = time.monotonic()
    opened = send("w1", 0, new=True, most=40.0)
    assert (opened.stored, opened.task_id, opened.opened) == (True, "w1", True)
    refused = send("w2", 1, new=True)  # a window is open: send again with its id
    assert (refused.stored, refused.task_id) == (False, "w1")
    joined = send("w1", 1, new=False, most=40.0)
    between = time.monotonic() - began  # at least the time from the first send to this
    assert (joined.stored, joined.opened) == (True, False)
    # pushed later by the later send: its own wait (30 s) from when it came, so later by
    # the time between the two sends, no more (Redis's clock and ours run alike)
    assert opened.release < joined.release <= opened.release + between + 0.05
    assert parked.count() == 1
    assert parked.counts() == {"debounce:job": 1}
    bounded = send("w1", 2, new=False, most=0.001)  # at most 1 ms after the first send
    assert bounded.release < joined.release
    claims: list[Any] = []

    def claimed() -> bool:
        claims.extend(parked.claim(0.0, 30.0, 10, 3600.0)[2])
        return bool(claims)

    wait_for(claimed, 2)
    assert [(c.task_id, c.message["body"]) for c in claims] == [("w1", b"[[2], {}, {}]")]
    closed = send("w1", 3, new=False)  # its run is being released: a new window
    assert (closed.stored, closed.task_id) == (False, "")
    again = send("w3", 3, new=True)
    assert (again.stored, again.task_id, again.opened) == (True, "w3", True)
