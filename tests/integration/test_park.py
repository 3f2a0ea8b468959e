"""Parked tasks on a real Redis: the store's exactly-once rules, and a real worker's
releaser publishing what was parked, at its time, once."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker
from celery.worker import state as worker_state

from celery_funnel import ConfigurationError
from celery_funnel._config.runtime import runtime_for
from celery_funnel._stores.copies import CopiesBusyError
from celery_funnel._stores.park import ParkStore, Release, capture
from celery_funnel.testing import RedisServer
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for

# every script touches only the keys it is given (read from what Redis ran)
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("declared_keys_only")]
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)


@pytest.fixture
def store(redis_client: redis.Redis) -> ParkStore:
    return ParkStore(redis_client, f"test-{uuid.uuid4().hex[:8]}:")


def message(n: int = 0, funnel: str = "f") -> dict[str, Any]:
    return {
        "body": b"{}", "content_type": "application/json", "content_encoding": "utf-8",
        "headers": {"task": "t", "id": f"id{n}"}, "properties": {}, "priority": None,
        "exchange": "", "routing_key": "q", "declare": [],
        "meta": {"task": "t", "funnel": funnel, "priority": None, "parked_at": time.time()},
    }  # fmt: skip


def test_an_entry_is_claimed_once_when_due_and_forgotten_when_a_copy_is_accepted(
    store: ParkStore,
) -> None:
    assert store.park("a", 0.3, message(), "")
    _, _, early = store.claim(0.0, 30.0, 10, 3600.0)
    assert early == []
    wait_for(lambda: store.claim(0.0, 30.0, 10, 3600.0)[2] == [], 1)  # not due yet: none
    time.sleep(0.3)  # the release time, on the server's clock
    _, _, (release,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert release.task_id == "a"
    assert release.message["body"] == b"{}"
    assert store.claim(0.0, 30.0, 10, 3600.0)[2] == [], "claimed: not handed out twice"
    assert store.count() == 1, "kept until a worker accepts its copy"
    assert store.accept("a", release.token)
    assert store.count() == 0


def test_a_release_no_worker_accepted_is_published_again_and_the_first_copy_wins(
    store: ParkStore,
) -> None:
    """A released copy may be lost on its way (the worker that took it from the queue
    killed before the broker recorded it): once the lease runs out the entry is claimed
    again. Should both copies arrive, the first accepted runs, the other is dropped."""
    store.park("a", 0.0, message(), "")
    _, _, (first,) = store.claim(0.0, 0.05, 10, 3600.0)
    time.sleep(0.06)
    _, _, (second,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert second.task_id == "a"
    assert first.token != second.token
    assert store.accept("a", first.token), "the first copy to arrive runs, however old"
    assert store.accept("a", first.token), "the same copy delivered again by the broker runs"
    assert not store.accept("a", second.token), "the other copy is dropped"
    assert store.count() == 0, "accepting completed the release"


def test_a_backup_is_claimed_for_its_copy_and_published_again_only_if_that_is_lost(
    store: ParkStore,
) -> None:
    """A copy published again with a countdown is backed up: claimed for that copy at
    once, not counted as parked; the message held, delivered again, is dropped; the
    copy accepted forgets the backup; a copy never accepted has its backup claimed
    again once the claim is over, and the first copy accepted runs."""
    assert store.park("a", 0.0, message(), "", backup=("copy-a", 60.0))
    assert store.counts() == {}, "not counted as parked"
    assert store.entries() == [], "nor listed as waiting to be released"
    assert store.claim(0.0, 30.0, 10, 3600.0)[2] == [], "claimed for its copy"
    assert not store.accept("a", ""), "the message held, delivered again: dropped"
    assert store.accept("a", "copy-a"), "the copy runs"
    assert store.count() == 0, "and its backup is forgotten"

    assert store.park("b", 0.0, message(1), "", backup=("copy-b", 0.05))
    found: list[Release] = []

    def claimed_again() -> bool:
        found.extend(store.claim(0.0, 30.0, 10, 3600.0)[2])
        return bool(found)

    wait_for(claimed_again, 2)
    (again,) = found
    assert (again.task_id, again.message["meta"]["funnel"]) == ("b", "f")
    assert store.accept("b", again.token), "the copy published again runs"
    assert not store.accept("b", "copy-b"), "the lost copy, should it come after all: dropped"
    assert store.count() == 0


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def test_each_claim_again_lasts_twice_as_long_up_to_sixteen_times_the_lease(
    store: ParkStore, redis_client: redis.Redis
) -> None:
    """Each claim of an entry no copy was accepted for lasts twice the one before, at
    most 16 times the lease. Read on Redis's clock, not by sleeping: the claim's end in
    the leases set, against the server's time just before and after the claim, so a
    slow machine widens the window but cannot fail it; a lease 32 times as long falls
    outside it unless one claim's round trip takes 16 leases (0.8 s)."""
    lease = 0.05
    ends: list[float] = []
    for times in (1, 2, 4, 8, 16, 16, 16):
        if times == 1:
            store.park("a", 0.0, message(), "")
        before: list[int] = []

        def claimed(into: list[int] = before) -> bool:
            into[:] = [_server_us(redis_client)]
            return len(store.claim(0.0, lease, 10, 3600.0)[2]) == 1

        wait_for(claimed, 10)  # the lease before ran out (the first: due at once)
        after = _server_us(redis_client)
        end = redis_client.zscore(store.keys.leases, "a")
        assert end is not None
        lasts = (end - after) / 1e6, (end - before[0]) / 1e6
        ends.append(end / 1e6)
        assert lasts[0] <= lease * times <= lasts[1], (
            f"claim {len(ends)} lasts between {lasts[0]:.3f} and {lasts[1]:.3f} s on"
            f" Redis's clock, not {times} x {lease} s"
        )
    assert store.count() == 1, "kept until a copy is accepted"


def test_a_release_accepted_before_its_lease_lapsed_is_not_published_again(
    store: ParkStore,
) -> None:
    store.park("a", 0.0, message(), "")
    _, _, (first,) = store.claim(0.0, 0.05, 10, 3600.0)
    assert store.accept("a", first.token)
    time.sleep(0.06)
    assert store.claim(0.0, 30.0, 10, 3600.0)[2] == []
    assert store.count() == 0


def test_a_task_released_accepted_and_parked_again_runs_from_its_next_release(
    store: ParkStore,
) -> None:
    store.park("a", 0.0, message(), "")
    _, _, (first,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert store.accept("a", first.token)
    assert store.park("a", 0.0, message(), first.token), "deferred again by the gate"
    _, _, (second,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert not store.accept("a", first.token), "the earlier copy, delivered again: dropped"
    assert store.accept("a", second.token)


def test_a_stale_copy_of_an_accepted_task_is_not_parked_again(store: ParkStore) -> None:
    store.park("a", 0.0, message(), "")
    _, _, (release,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert store.accept("a", release.token)
    assert not store.park("a", 5.0, message(), ""), "the broker's original, delivered again"
    assert store.park("a", 5.0, message(), release.token), "the released copy, deferred again"
    assert store.count() == 1


def test_a_copy_of_a_parked_task_is_dropped_and_its_entry_stays(store: ParkStore) -> None:
    """The gate parked the original, and its ack was lost: the broker delivers it
    again. The entry holds the task; the copy delivered is dropped, before and after
    the release."""
    assert store.park("a", 0.0, message(), "")
    assert not store.accept("a", ""), "delivered again while parked"
    assert not store.park("a", 0.0, message(1), ""), "nor parked twice"
    assert store.count() == 1
    _, _, (release,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert release.message["headers"]["id"] == "id0"
    assert not store.park("a", 0.0, message(), ""), "after its release: a stale copy"
    assert store.accept("a", release.token)
    assert store.count() == 0


def test_a_later_message_given_a_released_tasks_id_is_a_task_of_its_own(
    store: ParkStore,
) -> None:
    """Celery's ``replace`` gives a chain's last task (or a chord's body) the replaced
    task's id, and another run sends it. Parked after the replaced task was released
    and ran, it is released and runs in turn; copies of either message stay stale."""
    first, later = "t\n\n0", "t\nlink-id\n1"  # task, parent, replaced_task_nesting
    assert store.park("a", 0.0, message(), "", first)
    _, _, (release,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert store.accept("a", release.token)
    assert not store.park("a", 0.0, message(), "", first), "the first, delivered again"
    assert store.park("a", 0.0, message(1), "", later), "the chain's last task"
    assert not store.park("a", 0.0, message(), "", first), "the first, delivered again"
    _, _, (again,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert again.message["headers"]["id"] == "id1"
    assert not store.accept("a", release.token), "a copy of the first release"
    assert store.accept("a", again.token)
    assert not store.park("a", 0.0, message(1), "", later), "the later, delivered again"
    assert store.park("a", 0.0, message(1), again.token, later), "its release, deferred again"
    assert store.count() == 1


def test_two_sends_of_one_task_id_wait_in_turn_and_each_runs(store: ParkStore) -> None:
    """Two sends of one task id (each with its own mark, the origin's last line): the
    copies' record follows the first until a copy of it is accepted; the second waits
    meanwhile (``CopiesBusyError``: parked, moved or checked), then starts a record of
    its own. Copies of the first stay stale after."""
    first, second = "t\n\n0\nsend-1", "t\n\n0\nsend-2"
    assert store.park("a", 0.0, message(), "", first)
    for wait in (
        lambda: store.park("a", 0.0, message(1), "", second),
        lambda: store.copies.move("a", "", "n1", second),
        lambda: store.copies.accept("a", "", second, redelivered=True),
    ):
        with pytest.raises(CopiesBusyError):
            wait()
    _, _, (release,) = store.claim(0.0, 30.0, 10, 3600.0)
    with pytest.raises(CopiesBusyError):
        store.park("a", 0.0, message(1), "", second)  # released: no copy accepted yet
    assert store.accept("a", release.token)
    assert store.park("a", 0.0, message(1), "", second), "the first settled: the second"
    assert not store.park("a", 0.0, message(), "", first), "the first, delivered again"
    _, _, (again,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert again.message["headers"]["id"] == "id1"
    assert store.accept("a", again.token)
    assert store.copies.move("a", "", "n2", "t\n\n0\nsend-3"), "a third send, later"
    assert store.copies.accept("a", "n2")


def test_an_accepted_copy_of_an_earlier_send_moves_after_a_later_send(
    store: ParkStore,
) -> None:
    """The first send's original, delivered again, is accepted and waits; the record
    moves on to a second send of the id (the first was settled: accepted, none on its
    way). When the first send's original moves after all, it waits while the second's
    copy is on its way, then takes the record back; stale copies of either are dropped."""
    copies, first, second = store.copies, "t\n\n0\nsend-1", "t\n\n0\nsend-2"
    assert copies.accept("a", "", first, redelivered=True)
    assert copies.move("a", "", "n1", second), "the second send moves: the record with it"
    with pytest.raises(CopiesBusyError):
        store.park("a", 0.0, message(), "", first)
    with pytest.raises(CopiesBusyError):
        copies.accept("a", "", first, redelivered=True)  # handed back, delivered again
    assert copies.accept("a", "n1", second)
    assert store.park("a", 0.0, message(), "", first), "the first send's, accepted, parks"
    assert not copies.accept("a", "", second, redelivered=True), "a stale copy of the second"
    assert not copies.accept("a", "n2", first), "a copy of the first it never made"
    _, _, (release,) = store.claim(0.0, 30.0, 10, 3600.0)
    assert store.accept("a", release.token)
    assert store.count() == 0


def test_a_tasks_records_go_with_it(store: ParkStore, redis_client: redis.Redis) -> None:
    """What tells messages apart lives as long as the task's record of copies: a purged
    task's record says so (a copy delivered later does not run) until it expires, as
    the record of one released does."""
    accepted = store.keys[4]
    store.park("a", 0.0, message(), "", "t\n\n0")
    _, _, (release,) = store.claim(0.0, 30.0, 10, 3600.0)
    store.accept("a", release.token)
    store.park("b", 60.0, message(1), "", "t\n\n0")
    assert redis_client.hlen(accepted) == 4  # a's and b's records, a's and b's origins
    assert store.purge() == 1
    assert redis_client.hget(accepted, "b") == b"gone"
    assert not store.copies.accept("b", ""), "purged: a copy delivered later is dropped"
    store.claim(0.0, 30.0, 10, 0.0)  # records older than 0 s are forgotten
    assert redis_client.hlen(accepted) == 0


def test_a_copy_published_again_runs_once_whichever_comes_first(store: ParkStore) -> None:
    """The gate publishes a new copy of a message it holds (a wait too long to hold),
    recorded first, then acks the one held. Should the ack be lost (its worker killed),
    both come: the first accepted runs, the other is dropped."""
    copies = store.copies
    assert copies.move("a", "", "n1")
    assert copies.accept("a", "n1"), "the new copy, as usual"
    assert not copies.accept("a", ""), "the original, delivered again after all: dropped"
    assert copies.move("b", "", "n1")
    assert copies.accept("b", ""), "the original, delivered again first: it goes on"
    assert not copies.accept("b", "n1"), "and the new copy is dropped"
    assert copies.move("c", "", "n1")
    assert copies.move("c", "", "n2"), "its publish failed: moved again"
    assert copies.accept("c", "n1"), "the first publish got through after all"
    assert not copies.accept("c", "n2")
    assert not copies.move("c", "", "n3"), "the original is stale: nothing more is published"
    assert copies.accept("d", "t"), "a copy whose record expired (or a Redis restarted)"
    assert not copies.accept("d", ""), "another copy of it, later: dropped"
    assert not copies.accept("e", "t", drop=True), "revoked: settled, nothing runs"
    assert not copies.accept("e", "t")


def test_a_run_whose_ack_failed_is_not_run_again_but_its_retry_is(store: ParkStore) -> None:
    """The broker died as the run of task "a" was acked: the broker delivers the message
    again, which is dropped; a retry of that run, sent from its body, carries its token
    and goes on (parked, moved, accepted)."""
    copies = store.copies
    assert copies.ran([("a", "")]) == 1
    assert not copies.accept("a", "", redelivered=True), "the message delivered again"
    assert store.park("a", 0.0, message(), ""), "a retry sent from its body, deferred"
    assert copies.accept("b", "t")
    assert copies.ran([("b", "t")]) == 1
    assert not copies.accept("b", "t", redelivered=True)
    assert copies.move("b", "t", "n"), "a retry carrying the run's token, published again"
    assert copies.accept("b", "n")
    assert copies.ran([("b", "t")]) == 0, "another copy is the accepted one by now"
    assert copies.accept("c", "t")
    assert copies.ran([("c", "t"), ("d", "")]) == 2
    assert copies.accept("c", "t"), "a retry of it, sent from its body, delivered once"


def test_claims_are_bounded_and_in_release_order(store: ParkStore) -> None:
    # release times a minute apart, so that the order holds however slowly they park
    for n in range(30):
        store.park(f"t{n:02}", 60.0 * (30 - n), message(n), "")
    _, _, batch = store.claim(3600.0, 30.0, 10, 3600.0)
    assert [r.task_id for r in batch] == [f"t{n:02}" for n in range(29, 19, -1)]
    assert [p.task_id for p in store.entries()][:3] == ["t19", "t18", "t17"]


def test_counts_per_funnel_purge_and_release_now(store: ParkStore) -> None:
    for n in range(5):
        store.park(f"a{n}", 60.0, message(n, "emails"), "")
    for n in range(3):
        store.park(f"b{n}", 60.0, message(n, "limit:sms.*"), "")
    store.park("a0", 60.0, message(0, "emails"), "")  # parked again: counted once
    assert store.counts() == {"emails": 5, "limit:sms.*": 3}
    assert {p.task_id for p in store.entries(label="limit:sms.*")} == {"b0", "b1", "b2"}
    assert store.purge("limit:sms.*") == 3
    assert store.counts() == {"emails": 5}
    assert store.claim(0.0, 30.0, 10, 3600.0)[2] == []
    assert store.purge("emails", release=True) == 5
    _, _, released = store.claim(0.0, 30.0, 10, 3600.0)
    assert sorted(r.task_id for r in released) == [f"a{n}" for n in range(5)]
    for release in released:
        store.accept(release.task_id, release.token)
    assert store.counts() == {}
    assert store.count() == 0


@pytest.fixture
def app(redis_url: str, redis_client: redis.Redis) -> Iterator[Celery]:
    redis_client.flushall()
    app = make_app(redis_url, redis_url)  # install(app) adds the releaser
    yield app
    close_app(app)


def park_task(app: Celery, store: ParkStore, wait: float, n: int) -> str:
    signature = app.tasks["proj.plain"].s(n).set(task_id=uuid.uuid4().hex)
    meta = {"task": "proj.plain", "funnel": "f", "priority": None, "parked_at": time.time()}
    assert store.park(signature.id, wait, capture(signature, meta), "")
    return str(signature.id)


def test_a_release_moves_out_only_if_nothing_moved_it_since_the_park(store: ParkStore) -> None:
    """``postpone``: a task parked for a short while and then queued has its release
    moved out, unless something moved it meanwhile (made due, claimed)."""
    release = store.park("a", 60.0, message(), "")
    assert release is not None
    assert store.postpone("a", release, 3600.0)
    (entry,) = store.entries()
    assert entry.release_at > time.time() + 3000, "moved out"
    assert not store.postpone("a", release, 3600.0), "no longer at the time it was parked at"
    later = store.park("b", 60.0, message(1), "")
    assert later is not None
    assert store.make_due(["b"]) == 1  # a seat handed to it, say
    assert not store.postpone("b", later, 3600.0), "made due: it stays due"
    assert [r.task_id for r in store.claim(0.0, 30.0, 10, 3600.0)[2]] == ["b"]
    assert not store.postpone("c", 0, 3600.0), "nothing parked"


def test_a_worker_releases_parked_tasks_at_their_time_once(
    app: Celery, redis_url: str, redis_client: redis.Redis
) -> None:
    store = ParkStore(redis_client, "funnel:")
    parked_at = time.time()
    ids = [park_task(app, store, 1.5, n) for n in range(3)]
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        wait_for(lambda: len(runs(redis_url)) == 3, 20)
    recorded = runs(redis_url)
    assert sorted(r["id"] for r in recorded) == sorted(ids), "each ran once"
    # released up to a second early (the gate holds an early arrival); never late
    assert all(r["at"] >= parked_at + 1.5 - 1.0 for r in recorded)
    assert store.count() == 0


def revoke_reached(app: Celery, task_id: str) -> bool:
    """Send a revoke of ``task_id``; whether this process's worker has it now."""
    if task_id not in worker_state.revoked:
        app.control.revoke(task_id)
    return task_id in worker_state.revoked


def test_a_revoked_parked_task_never_runs(
    app: Celery, redis_url: str, redis_client: redis.Redis
) -> None:
    store = ParkStore(redis_client, "funnel:")
    revoked = park_task(app, store, 60.0, 0)
    kept = park_task(app, store, 60.0, 1)
    received: list[str] = []

    def on_received(request: Any, **_: Any) -> None:
        received.append(request.id)

    signals.task_received.connect(on_received, weak=False)
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            # a broadcast sent before the worker's control queue is bound is lost: repeat it
            wait_for(partial(revoke_reached, app, revoked), 20)
            assert store.purge(release=True) == 2  # due now
            wait_for(lambda: len(runs(redis_url)) == 1, 20)
            wait_for(lambda: store.count() == 0, 20)
    finally:
        signals.task_received.disconnect(on_received)
    assert [r["id"] for r in runs(redis_url)] == [kept]
    assert received == [kept], "the revoked task was dropped, not published"
    assert app.AsyncResult(revoked).state == "REVOKED"


@pytest.mark.parametrize(
    ("park", "aof", "shared", "parks", "said"),
    [
        ("auto", False, False, False, "parking is off: the funnels' Redis has no append-only"),
        ("auto", True, False, True, "parking is on: the funnels' Redis has an append-only"),
        ("auto", False, True, True, "parking is on: the funnels' Redis is the broker's own"),
        (False, False, True, False, ""),
    ],
    ids=["auto, no AOF", "auto, AOF", "auto, the broker's Redis", "off"],
)
def test_a_worker_says_at_start_which_rule_lets_it_park(
    caplog: pytest.LogCaptureFixture,
    park: bool | str,
    aof: bool,
    shared: bool,
    parks: bool,
    said: str,
) -> None:
    """A task waits nowhere less safe than the broker's queue: with ``funnel_park="auto"``
    (the default) the worker parks where the funnels' Redis has an append-only file, or
    is the broker's own server (db 1 the broker, db 2 the funnels: one ``run_id``), and
    parks nothing on another Redis without AOF; it says which, once, at start."""
    caplog.set_level(logging.INFO, logger="celery_funnel")
    with RedisServer(aof=aof) as server, RedisServer() as other:
        broker = server.url.rsplit("/", 1)[0] + "/1" if shared else other.url
        app = make_app(broker, server.url.rsplit("/", 1)[0] + "/2", funnel_park=park)
        try:
            with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
                assert runtime_for(app).persistence.keeps() is parks
        finally:
            close_app(app)
    lines = [
        r.getMessage() for r in caplog.records if "celery-funnel: parking is" in r.getMessage()
    ]
    assert len(lines) == (1 if said else 0), lines
    assert all(said in line for line in lines)


def test_funnel_park_true_on_a_redis_without_aof_stops_the_worker() -> None:
    """... unless it is the broker's own server (the test above)."""
    with RedisServer() as server, RedisServer() as broker:
        app = make_app(broker.url, server.url, funnel_park=True)
        try:
            refused = pytest.raises(ConfigurationError, match="has no append-only file")
            with refused, start_worker(app, pool="solo", perform_ping_check=False):
                pass
        finally:
            close_app(app)
