"""The lease scripts on a real Redis: slots taken all or none, given back once by their
token, handed to the oldest waiter, renewed in one call, and freed when a lease runs
out; waiters claimed for release from the parked index."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from celery_funnel._limiter.keys import concurrency_keys, task_key
from celery_funnel._stores.concurrency import ConcurrencyFunnel, ConcurrencyStore, HeldWaiter
from celery_funnel._stores.park import ParkStore
from celery_funnel._stores.store import text
from tests.polling import wait_for

# every script touches only the keys it is given (read from what Redis ran)
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("declared_keys_only")]
ONE_REDIS = True  # the scripts' behaviour does not depend on the server's version


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


def funnel(prefix: str, n: int, name: str = "job") -> ConcurrencyFunnel:
    return ConcurrencyFunnel(n, task_key(prefix, name), name)


def test_n_slots_then_waiters_in_arrival_order(redis_client: redis.Redis, prefix: str) -> None:
    store = ConcurrencyStore(redis_client, prefix, 30.0)
    two = [funnel(prefix, 2)]
    a, _ = store.take(two, "a", "w1")
    b, _ = store.take(two, "b", "w1")
    assert a is not None
    assert b is not None
    assert store.take(two, "c", "w2") == (None, [])  # full: nothing taken
    assert store.queue(two, "c") == []
    assert store.queue(two, "d") == []
    assert store.queue(two, "c") == []  # queued again: keeps its place
    assert store.waiting(two[0].key) == 2
    assert store.free(two, "a", a.token) == (1, [(two[0], "c")])  # the oldest waiter
    assert store.free(two, "a", a.token) == (0, [])  # once only
    assert store.free(two, "b", "another run's token") == (0, [])
    handed = {h.task_id: h for h in store.holders(two[0].key)}
    assert handed["c"].token == ""
    assert handed["b"].worker == "w1"
    assert store.take(two, "e", "w2")[0] is None  # the slot is c's, not a newcomer's
    c, _ = store.take(two, "c", "w2")
    assert c is not None  # the slot handed to it while parked
    assert store.waiting(two[0].key) == 1  # d still waits
    assert store.take(two, "c", "w3")[0] is None  # a second run of c: no slot


def test_all_or_none_over_several_funnels(redis_client: redis.Redis, prefix: str) -> None:
    store = ConcurrencyStore(redis_client, prefix, 30.0)
    free, full = funnel(prefix, 1, "free"), funnel(prefix, 1, "full")
    assert store.take([full], "x", "w")[0] is not None
    assert store.take([free, full], "y", "w")[0] is None
    assert store.holders(free.key) == []  # nothing kept in the funnel that had room


def test_a_lease_not_renewed_runs_out(redis_client: redis.Redis, prefix: str) -> None:
    short = ConcurrencyStore(redis_client, prefix, 0.2)
    one = [funnel(prefix, 1)]
    held, _ = short.take(one, "dead", "w1")
    assert held is not None
    short.queue(one, "waiter")
    promoted: list[tuple[ConcurrencyFunnel, str]] = []

    def swept() -> list[
        tuple[ConcurrencyFunnel, str]
    ]:  # another worker's renewal sweeps the funnel
        promoted.extend(short.renew(one, {}).promoted)
        return promoted

    wait_for(swept, 5)
    assert promoted == [(one[0], "waiter")]
    assert [h.task_id for h in short.holders(one[0].key)] == ["waiter"]


def test_one_call_renews_every_lease(redis_client: redis.Redis, prefix: str) -> None:
    store = ConcurrencyStore(redis_client, prefix, 30.0)
    one, two = funnel(prefix, 1, "one"), funnel(prefix, 2, "two")
    a, _ = store.take([one, two], "a", "w")
    b, _ = store.take([two], "b", "w")
    assert a is not None
    assert b is not None
    before = {h.task_id: h.expires for h in store.holders(two.key)}
    store.free([two], "b", b.token)  # given back by the pool process that ran it
    held = {one.key: [("a", a.token)], two.key: [("a", a.token), ("b", b.token)]}
    renewal = store.renew([one, two], held)
    assert renewal.gone == [(two.key, "b")]
    assert renewal.empty == []
    assert store.holders(two.key)[0].expires >= before["a"]
    store.free([one, two], "a", a.token)
    assert store.renew([one, two], {}).empty == [one.key, two.key]


def test_waiters_are_claimed_from_the_parked_index(redis_client: redis.Redis, prefix: str) -> None:
    store, parked = ConcurrencyStore(redis_client, prefix, 30.0), ParkStore(redis_client, prefix)
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
    store = ConcurrencyStore(redis_client, prefix, 30.0)
    one = [funnel(prefix, 1)]
    a, _ = store.take(one, "a", "w1")
    assert a is not None
    assert store.queue(one, "late", rank=9) == []
    assert store.queue(one, "later", rank=9) == []
    assert store.queue(one, "urgent", rank=0) == []  # sent last, the broker's first
    assert store.queue(one, "late", rank=9) == []  # queued again: keeps its place
    assert store.free(one, "a", a.token) == (1, [(one[0], "urgent")])
    urgent, _ = store.take(one, "urgent", "w1")
    assert urgent is not None
    assert store.free(one, "urgent", urgent.token) == (1, [(one[0], "late")])


def test_held_waiters_are_handed_seats_in_refusal_order_and_told(
    redis_client: redis.Redis, prefix: str
) -> None:
    """Runs held in their worker (nothing parked): refused, each is queued as it was
    refused (a burst within one ms included), a freed seat goes to the first and is
    published on its worker's channel (not returned: nothing to publish from the
    broker), and it takes its seat; a second look keeps its place."""
    store = ConcurrencyStore(redis_client, prefix, 30.0)
    one = [funnel(prefix, 1)]
    channel = f"{prefix}{{~handed}}#w1"
    held = HeldWaiter(channel, 5.0)
    first, _ = store.take(one, "first", "w1", held=held)
    assert first is not None
    names = [f"t{n:02d}" for n in range(20)][::-1]  # refused in an order no sort gives
    for name in names:
        assert store.take(one, name, "w1", held=held) == (None, [])
    assert store.take(one, names[3], "w1", held=held) == (None, [])  # looks again
    queued = redis_client.zrange(concurrency_keys(one[0].key).waiters, 0, -1)
    assert [text(i) for i in queued] == names
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    wait_for(lambda: pubsub.get_message(timeout=0.1) is None, 5)  # subscribed
    assert store.free(one, "first", first.token) == (1, [])  # told, not returned
    message = pubsub.get_message(timeout=2.0)
    assert message is not None
    assert message["data"] == names[0].encode()
    (handed,) = store.holders(one[0].key)  # `celery funnel status` names its worker
    assert (handed.task_id, handed.worker, handed.held_by) == (names[0], "", "w1")
    assert store.take(one, names[1], "w1", held=held)[0] is None  # the seat is t19's
    lease, _ = store.take(one, names[0], "w1", held=held)
    assert lease is not None
    info = redis_client.hgetall(concurrency_keys(one[0].key).info)
    assert f"held:{names[0]}".encode() not in info  # its mark went with its place
    pubsub.close()


def test_a_held_waiter_whose_worker_stopped_looking_leaves_the_queue(
    redis_client: redis.Redis, prefix: str
) -> None:
    """A held waiter's mark lasts what its worker said past its last look: once it
    ended (the worker died), a freed seat skips it for the next waiter, and it is gone
    from the queue; one given up (``release`` with "") goes with its mark."""
    store = ConcurrencyStore(redis_client, prefix, 30.0)
    one = [funnel(prefix, 1)]
    lease, _ = store.take(one, "run", "w1")
    assert lease is not None
    assert store.take(one, "dead", "w1", held=HeldWaiter("c1", 0.05))[0] is None
    assert store.take(one, "live", "w2", held=HeldWaiter("c2", 5.0))[0] is None
    assert store.take(one, "gone", "w2", held=HeldWaiter("c2", 5.0))[0] is None
    time.sleep(0.1)  # the dead waiter's worker stops looking (a fault, not a wait)
    store.free(one, "gone", "")
    assert store.free(one, "run", lease.token) == (1, [])
    assert [h.task_id for h in store.holders(one[0].key)] == ["live"]
    assert store.waiting(one[0].key) == 1  # live only: dead dropped, gone given up
    fields = {text(f) for f in redis_client.hkeys(concurrency_keys(one[0].key).info)}
    assert fields == {"live", "held:live"}


def test_a_seat_a_held_waiter_gives_back_goes_on_to_the_next_waiter(
    redis_client: redis.Redis, prefix: str
) -> None:
    """A held waiter of two funnels is handed a freed seat in one, looks again, and is
    refused by the other: it gives the seat back (it keeps none while it waits) and the
    seat goes on at once to the next waiter of that funnel, held (told on its worker's
    channel) or parked (returned, to be published). Without that the seat stays empty
    until some later call happens to promote waiters."""
    store = ConcurrencyStore(redis_client, prefix, 30.0)
    shared, other = funnel(prefix, 1, "shared"), funnel(prefix, 1, "other")
    held = HeldWaiter(f"{prefix}{{~handed}}#w1", 5.0)
    for kind in ("held", "parked"):
        running, _ = store.take([shared], f"run-{kind}", "w0")
        blocking, _ = store.take([other], f"block-{kind}", "w0")
        assert running is not None
        assert blocking is not None
        assert store.take([shared, other], f"both-{kind}", "w1", held=held)[0] is None
        if kind == "held":
            assert store.take([shared], "next-held", "w2", held=held)[0] is None
        else:
            assert store.queue([shared], "next-parked") == []
        # the run ends: its seat in "shared" goes to the first waiter, held: told
        assert store.free([shared], f"run-{kind}", running.token) == (1, [])
        assert [h.task_id for h in store.holders(shared.key)] == [f"both-{kind}"]
        # it looks again: "other" is full, so it gives the seat back, to the next one
        taken, handed = store.take([shared, other], f"both-{kind}", "w1", held=held)
        assert taken is None
        assert [h.task_id for h in store.holders(shared.key)] == [f"next-{kind}"]
        assert handed == ([] if kind == "held" else [(shared, "next-parked")])
        # clean up for the next kind: the seat's taker runs and ends, the block ends
        nxt, _ = store.take([shared], f"next-{kind}", "w2", held=held)
        assert nxt is not None
        store.free([shared], f"next-{kind}", nxt.token)
        store.free([other], f"block-{kind}", blocking.token)
        store.free([shared, other], f"both-{kind}", "")  # the waiter gives up
        assert store.holders(shared.key) == []
