"""The lease scripts on a real Redis: slots taken all or none, given back once by their
token, handed to the oldest waiter, renewed in one call, and freed when a lease runs
out; waiters claimed for release from the parked index."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from celery_funnel._limiter.keys import lease_keys, task_key
from celery_funnel._stores.leases import HeldWaiter, LeaseStore, SlotFunnel
from celery_funnel._stores.park import ParkStore
from celery_funnel._stores.store import text
from tests.polling import wait_for

# every script touches only the keys it is given (read from what Redis ran)
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("declared_keys_only")]
ONE_REDIS = True  # the scripts' behaviour does not depend on the server's version


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


def slot_funnel(prefix: str, n: int, name: str = "job") -> SlotFunnel:
    return SlotFunnel(n, task_key(prefix, name), name)


def test_n_slots_then_waiters_in_arrival_order(redis_client: redis.Redis, prefix: str) -> None:
    store = LeaseStore(redis_client, prefix, 30.0)
    two = [slot_funnel(prefix, 2)]
    a, _ = store.acquire(two, "a", "w1")
    b, _ = store.acquire(two, "b", "w1")
    assert a is not None
    assert b is not None
    assert store.acquire(two, "c", "w2") == (None, [])  # full: nothing taken
    assert store.enqueue(two, "c") == []
    assert store.enqueue(two, "d") == []
    assert store.enqueue(two, "c") == []  # queued again: keeps its place
    assert store.waiting(two[0].key) == 2
    assert store.release(two, "a", a.token) == (1, [(two[0], "c")])  # the oldest waiter
    assert store.release(two, "a", a.token) == (0, [])  # once only
    assert store.release(two, "b", "another run's token") == (0, [])
    handed = {h.task_id: h for h in store.holders(two[0].key)}
    assert handed["c"].token == ""
    assert handed["b"].worker == "w1"
    assert store.acquire(two, "e", "w2")[0] is None  # the slot is c's, not a newcomer's
    c, _ = store.acquire(two, "c", "w2")
    assert c is not None  # the slot handed to it while parked
    assert store.waiting(two[0].key) == 1  # d still waits
    assert store.acquire(two, "c", "w3")[0] is None  # a second run of c: no slot


def test_all_or_none_over_several_funnels(redis_client: redis.Redis, prefix: str) -> None:
    store = LeaseStore(redis_client, prefix, 30.0)
    free, full = slot_funnel(prefix, 1, "free"), slot_funnel(prefix, 1, "full")
    assert store.acquire([full], "x", "w")[0] is not None
    assert store.acquire([free, full], "y", "w")[0] is None
    assert store.holders(free.key) == []  # nothing kept in the funnel that had room


def test_a_lease_not_renewed_runs_out(redis_client: redis.Redis, prefix: str) -> None:
    short = LeaseStore(redis_client, prefix, 0.2)
    one = [slot_funnel(prefix, 1)]
    held, _ = short.acquire(one, "dead", "w1")
    assert held is not None
    short.enqueue(one, "waiter")
    promoted: list[tuple[SlotFunnel, str]] = []

    def swept() -> list[tuple[SlotFunnel, str]]:  # another worker's renewal sweeps the funnel
        promoted.extend(short.renew(one, {}).promoted)
        return promoted

    wait_for(swept, 5)
    assert promoted == [(one[0], "waiter")]
    assert [h.task_id for h in short.holders(one[0].key)] == ["waiter"]


def test_one_call_renews_every_lease(redis_client: redis.Redis, prefix: str) -> None:
    store = LeaseStore(redis_client, prefix, 30.0)
    one, two = slot_funnel(prefix, 1, "one"), slot_funnel(prefix, 2, "two")
    a, _ = store.acquire([one, two], "a", "w")
    b, _ = store.acquire([two], "b", "w")
    assert a is not None
    assert b is not None
    before = {h.task_id: h.expires for h in store.holders(two.key)}
    store.release([two], "b", b.token)  # given back by the pool process that ran it
    held = {one.key: [("a", a.token)], two.key: [("a", a.token), ("b", b.token)]}
    renewal = store.renew([one, two], held)
    assert renewal.gone == [(two.key, "b")]
    assert renewal.empty == []
    assert store.holders(two.key)[0].expires >= before["a"]
    store.release([one, two], "a", a.token)
    assert store.renew([one, two], {}).empty == [one.key, two.key]


def test_waiters_are_claimed_from_the_parked_index(redis_client: redis.Redis, prefix: str) -> None:
    store, parked = LeaseStore(redis_client, prefix, 30.0), ParkStore(redis_client, prefix)
    message = {"body": b"x", "meta": {"funnel": "job", "task": "job", "parked_at": 0.0}}
    assert parked.park("w1", 3600.0, message, "")
    missing, releases = store.wake(["w1", "gone"], 30.0)
    assert missing == ["gone"]
    assert [(r.task_id, r.message["body"]) for r in releases] == [("w1", b"x")]
    assert store.wake(["w1"], 30.0) == ([], [])  # being released: left to its releaser
    assert parked.count() == 1, "kept until a worker accepts the copy"
    assert parked.accept("w1", releases[0].token)
    assert parked.count() == 0
    assert store.wake(["w1"], 30.0) == (["w1"], []), "released and run: its slot goes on"


def test_a_more_urgent_waiter_is_handed_a_slot_first(
    redis_client: redis.Redis, prefix: str
) -> None:
    store = LeaseStore(redis_client, prefix, 30.0)
    one = [slot_funnel(prefix, 1)]
    a, _ = store.acquire(one, "a", "w1")
    assert a is not None
    assert store.enqueue(one, "late", rank=9) == []
    assert store.enqueue(one, "later", rank=9) == []
    assert store.enqueue(one, "urgent", rank=0) == []  # sent last, the broker's first
    assert store.enqueue(one, "late", rank=9) == []  # queued again: keeps its place
    assert store.release(one, "a", a.token) == (1, [(one[0], "urgent")])
    urgent, _ = store.acquire(one, "urgent", "w1")
    assert urgent is not None
    assert store.release(one, "urgent", urgent.token) == (1, [(one[0], "late")])


def test_held_waiters_are_handed_seats_in_refusal_order_and_told(
    redis_client: redis.Redis, prefix: str
) -> None:
    """Runs held in their worker (nothing parked): refused, each is queued as it was
    refused (a burst within one ms included), a freed seat goes to the first and is
    published on its worker's channel (not returned: nothing to publish from the
    broker), and it takes its seat; a second look keeps its place."""
    store = LeaseStore(redis_client, prefix, 30.0)
    one = [slot_funnel(prefix, 1)]
    channel = f"{prefix}{{~handed}}#w1"
    held = HeldWaiter(channel, 5.0)
    first, _ = store.acquire(one, "first", "w1", held=held)
    assert first is not None
    names = [f"t{n:02d}" for n in range(20)][::-1]  # refused in an order no sort gives
    for name in names:
        assert store.acquire(one, name, "w1", held=held) == (None, [])
    assert store.acquire(one, names[3], "w1", held=held) == (None, [])  # looks again
    queued = redis_client.zrange(lease_keys(one[0].key)[2], 0, -1)
    assert [text(i) for i in queued] == names
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    wait_for(lambda: pubsub.get_message(timeout=0.1) is None, 5)  # subscribed
    assert store.release(one, "first", first.token) == (1, [])  # told, not returned
    message = pubsub.get_message(timeout=2.0)
    assert message is not None
    assert message["data"] == names[0].encode()
    (handed,) = store.holders(one[0].key)  # `celery funnel status` names its worker
    assert (handed.task_id, handed.worker, handed.held_by) == (names[0], "", "w1")
    assert store.acquire(one, names[1], "w1", held=held)[0] is None  # the seat is t19's
    lease, _ = store.acquire(one, names[0], "w1", held=held)
    assert lease is not None
    info = redis_client.hgetall(lease_keys(one[0].key)[1])
    assert f"held:{names[0]}".encode() not in info  # its mark went with its place
    pubsub.close()


def test_a_held_waiter_whose_worker_stopped_looking_leaves_the_queue(
    redis_client: redis.Redis, prefix: str
) -> None:
    """A held waiter's mark lasts what its worker said past its last look: once it
    ended (the worker died), a freed seat skips it for the next waiter, and it is gone
    from the queue; one given up (``release`` with "") goes with its mark."""
    store = LeaseStore(redis_client, prefix, 30.0)
    one = [slot_funnel(prefix, 1)]
    lease, _ = store.acquire(one, "run", "w1")
    assert lease is not None
    assert store.acquire(one, "dead", "w1", held=HeldWaiter("c1", 0.05))[0] is None
    assert store.acquire(one, "live", "w2", held=HeldWaiter("c2", 5.0))[0] is None
    assert store.acquire(one, "gone", "w2", held=HeldWaiter("c2", 5.0))[0] is None
    time.sleep(0.1)  # the dead waiter's worker stops looking (a fault, not a wait)
    store.release(one, "gone", "")
    assert store.release(one, "run", lease.token) == (1, [])
    assert [h.task_id for h in store.holders(one[0].key)] == ["live"]
    assert store.waiting(one[0].key) == 1  # live only: dead dropped, gone given up
    fields = {text(f) for f in redis_client.hkeys(lease_keys(one[0].key)[1])}
    assert fields == {"live", "held:live"}


def test_a_seat_a_held_waiter_gives_back_goes_on_to_the_next_waiter(
    redis_client: redis.Redis, prefix: str
) -> None:
    """A held waiter of two funnels is handed a freed seat in one, looks again, and is
    refused by the other: it gives the seat back (it keeps none while it waits) and the
    seat goes on at once to the next waiter of that funnel, held (told on its worker's
    channel) or parked (returned, to be published). Without that the seat stays empty
    until some later call happens to promote waiters."""
    store = LeaseStore(redis_client, prefix, 30.0)
    shared, other = slot_funnel(prefix, 1, "shared"), slot_funnel(prefix, 1, "other")
    held = HeldWaiter(f"{prefix}{{~handed}}#w1", 5.0)
    for kind in ("held", "parked"):
        running, _ = store.acquire([shared], f"run-{kind}", "w0")
        blocking, _ = store.acquire([other], f"block-{kind}", "w0")
        assert running is not None
        assert blocking is not None
        assert store.acquire([shared, other], f"both-{kind}", "w1", held=held)[0] is None
        if kind == "held":
            assert store.acquire([shared], "next-held", "w2", held=held)[0] is None
        else:
            assert store.enqueue([shared], "next-parked") == []
        # the run ends: its seat in "shared" goes to the first waiter, held: told
        assert store.release([shared], f"run-{kind}", running.token) == (1, [])
        assert [h.task_id for h in store.holders(shared.key)] == [f"both-{kind}"]
        # it looks again: "other" is full, so it gives the seat back, to the next one
        taken, handed = store.acquire([shared, other], f"both-{kind}", "w1", held=held)
        assert taken is None
        assert [h.task_id for h in store.holders(shared.key)] == [f"next-{kind}"]
        assert handed == ([] if kind == "held" else [(shared, "next-parked")])
        # clean up for the next kind: the seat's taker runs and ends, the block ends
        nxt, _ = store.acquire([shared], f"next-{kind}", "w2", held=held)
        assert nxt is not None
        store.release([shared], f"next-{kind}", nxt.token)
        store.release([other], f"block-{kind}", blocking.token)
        store.release([shared, other], f"both-{kind}", "")  # the waiter gives up
        assert store.holders(shared.key) == []
