"""One gate (issue 13), on real workers and real Redis servers: a task is charged once,
runs once, and keeps everything it was sent with; gate errors fail one task, not the
worker; a deferred task never looks started."""

from __future__ import annotations

import datetime
import math
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker
from kombu.entity import Exchange, Queue

from celery_funnel import ConfigurationError, FunnelTask
from celery_funnel import signals as funnel_signals
from celery_funnel._limiter.keys import limit_key, task_key
from celery_funnel._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests import redis_monitor
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for
from tests.redis_monitor import booked_again_early, funnel_log, one_slot_each, started_early

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)
ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    """A broker of the test's own, which it may cut connections on."""
    with RedisServer() as server:
        yield server


def workers(broker_url: str, funnel_url: str, count: int, **env: str) -> CeleryWorkers:
    base = {"FUNNEL_TEST_BROKER": broker_url, "FUNNEL_TEST_REDIS": funnel_url}
    return CeleryWorkers(
        "tests.integration.proj", count, {**base, **env}, "-c", "2", "-Q", "proj", cwd=ROOT
    )


def send(app: Celery, name: str, count: int, **options: Any) -> dict[str, float]:
    """Send ``count`` tasks; their ids and when each was sent."""
    sent: dict[str, float] = {}
    with app.producer_or_acquire() as producer:
        for n in range(count):
            at = datetime.datetime.now().timestamp()
            sent[app.tasks[name].apply_async((n,), producer=producer, **options).id] = at
    return sent


def rate(starts: list[float]) -> float:
    """Starts per second from the first to the last."""
    ordered = sorted(starts)
    return (len(ordered) - 1) / (ordered[-1] - ordered[0])


def once_each(funnel_url: str, name: str, ids: set[str]) -> list[dict[str, Any]]:
    """The run records of ``name``, checked: every id ran, and ran once."""
    recorded = [r for r in runs(funnel_url) if r["name"] == name]
    counts = Counter(r["id"] for r in recorded)
    assert set(counts) == ids, f"lost: {len(ids - set(counts))}"
    assert max(counts.values()) == 1, f"run twice: {sum(n - 1 for n in counts.values())}"
    return recorded


@pytest.mark.slow
def test_funnel_task_under_a_matching_worker_limit_is_charged_once(
    standalone_url: str, broker: RedisServer
) -> None:
    """FunnelTask 5/s whose name matches funnel_limits 5/s: 40 tasks on two prefork
    workers start at 5/s (charged twice, they ran at 1.67/s)."""
    env = {"FUNNEL_TEST_RATE": "5/s", "FUNNEL_TEST_LIMITS": '{"proj.steady": "5/s"}'}
    app = make_app(broker.url, standalone_url, task_ignore_result=True)
    keys = (task_key("funnel:", "proj.steady"), limit_key("funnel:", "proj.steady"))
    with (
        funnel_log(standalone_url, "funnel:") as log,
        workers(broker.url, standalone_url, 2, **env) as started,
    ):
        started.wait_ready()
        ids = set(send(app, "proj.steady", 40))
        wait_for(lambda: len(runs(standalone_url)) >= 40, 60)
    close_app(app)
    recorded = once_each(standalone_url, "proj.steady", ids)
    measured = rate([r["at"] for r in recorded])
    print(f"\ncharged once: {measured:.3f}/s for 5/s")
    # read from both funnels' decisions on Redis's clock: each run charged once on each
    # (a double charge moves a TAT two slots, or writes it twice a run), one 0.2 s slot
    # a decision, and no run before its slot. Was: starts at 5/s +- 5% (the workers'
    # clock: a loaded machine starts fewer a second; charged twice they ran at 1.67/s)
    starts = [r["at"] for r in recorded]
    for key in keys:
        writes = log.decisions(key)
        assert len(writes) == 40, f"{key}: {len(writes)} decisions for 40 runs"
        slots = one_slot_each(writes, 0.2, before=log.first_tat(key))
        assert started_early(starts, slots, DEFAULT_EARLY_SECONDS) == [], key


# a long wait, in both gates' modes: 60 tasks through 3/s
LONG_WAITS = pytest.mark.parametrize(
    ("task", "env"),
    [
        ("proj.plain", {"FUNNEL_TEST_LIMITS": '{"proj.plain": "3/s"}'}),
        ("proj.steady", {"FUNNEL_TEST_RATE": "3/s"}),
    ],
    ids=["funnel_limits", "FunnelTask"],
)


@pytest.mark.slow
@LONG_WAITS
def test_long_waits_are_published_again_once_per_countdown_cap(
    standalone_url: str, broker: RedisServer, task: str, env: dict[str, str]
) -> None:
    """60 tasks through 3/s with a 4 s visibility timeout (countdown cap 2 s), parking
    off: each task is published again at most once per 2 s it waits, never in a loop
    (the worker gate cost 13,081 re-queues, 222 per deferred task); none lost, none run
    twice. (With parking, the default, any wait costs one: test_park_gate.py.)"""
    sent, recorded, requeues = long_wait_run(
        broker.url, standalone_url, task, 1, {**env, "FUNNEL_TEST_PARK": "0"}
    )
    deferred = [r for r in recorded if r["deferrals"]]
    print(f"\n{task}: {requeues} re-queues for {len(deferred)} deferred tasks")
    assert requeues == sum(r["requeues"] for r in recorded)
    for r in recorded:
        waited = r["at"] - sent[r["id"]]
        assert r["requeues"] <= math.ceil(waited / 2.0) + 1, r
    assert requeues / len(deferred) <= 20 / 2 / 2 + 1  # waits average 10 s: ~5 each


def long_wait_run(
    broker_url: str, funnel_url: str, task: str, count: int, env: dict[str, str]
) -> tuple[dict[str, float], list[dict[str, Any]], int]:
    """60 ``task``s through ``count`` workers with a 4 s visibility timeout: when each was
    sent, the run records (each ran once), and the re-queues (broker pushes beyond the 60
    sends: every publish again, a release or a countdown, is one push)."""
    app = make_app(broker_url, funnel_url, task_ignore_result=True)
    with workers(broker_url, funnel_url, count, FUNNEL_TEST_VISIBILITY="4", **env) as started:
        started.wait_ready()
        with redis.Redis.from_url(broker_url) as client:
            client.config_resetstat()
            sent = send(app, task, 60)
            wait_for(lambda: len(runs(funnel_url)) >= 60, 90)
            pushed = pushes(client)
    close_app(app)
    return sent, once_each(funnel_url, task, set(sent)), pushed - 60


def pushes(client: redis.Redis) -> int:
    """LPUSH and RPUSH calls the broker served since its stats were reset."""
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("lpush", "rpush"))


@pytest.mark.slow
@pytest.mark.exclusive
@pytest.mark.parametrize("limit", [40, 100])
@pytest.mark.parametrize("mode", ["funnel_limits", "FunnelTask"])
def test_two_workers_hold_high_rates_within_five_percent(
    standalone_url: str, broker: RedisServer, limit: int, mode: str
) -> None:
    """40/s and 100/s through one funnel on two workers: within 5% of the limit, at most
    1.05 re-queues per deferred task (FunnelTask reached 33-35/s at 40/s, re-booking
    stale slots)."""
    if mode == "FunnelTask":
        task, env = "proj.steady", {"FUNNEL_TEST_RATE": f"{limit}/s"}
    else:
        task, env = "proj.plain", {"FUNNEL_TEST_LIMITS": f'{{"proj.plain": "{limit}/s"}}'}
    count = limit * 5
    app = make_app(broker.url, standalone_url, task_ignore_result=True)
    key = task_key("funnel:", task) if mode == "FunnelTask" else limit_key("funnel:", task)
    with (
        funnel_log(standalone_url, key) as log,
        workers(broker.url, standalone_url, 2, **env) as started,
    ):
        started.wait_ready()
        with redis.Redis.from_url(broker.url) as client:
            client.config_resetstat()
            ids = set(send(app, task, count))
            wait_for(lambda: len(runs(standalone_url)) >= count, 60)
            requeues = pushes(client) - count
    close_app(app)
    recorded = once_each(standalone_url, task, ids)
    deferred = [r for r in recorded if r["deferrals"]]
    measured = rate([r["at"] for r in recorded])
    print(f"\n{mode} {limit}/s: {measured:.2f}/s, {requeues} re-queues, {len(deferred)} deferred")
    # read from the funnel's decisions on Redis's clock: one slot of the limit a
    # decision, no run before its slot, and a task booked again only when it came back
    # after its slot's late grace (the 33-35/s at 40/s was slots booked again and left
    # unused). Was: starts at the limit +- 5% (the workers' clock: how fast a loaded
    # machine starts them; the speed is bench's)
    writes = log.decisions(key)
    slots = one_slot_each(writes, 1 / limit, before=log.first_tat(key))
    early = max(float(w.argv(4)) for w in writes) / 1e6  # the early grace reserve.lua used
    assert started_early([r["at"] for r in recorded], slots, early) == [], "ran early"
    assert booked_again_early(writes, 1 / limit) == [], "booked again while it could redeem"
    assert requeues <= 1.05 * len(deferred)


@pytest.mark.slow
def test_broker_connection_cut_while_tasks_are_held_runs_each_once(
    standalone_url: str, broker: RedisServer
) -> None:
    """16 tasks through 2/s, held in the worker gate; every broker connection is killed
    while they wait. The broker delivers the held ones again; the held copies are
    dropped with the connection (10 of 16 ran twice before)."""
    app = make_app(broker.url, standalone_url, task_ignore_result=True)
    env = {"FUNNEL_TEST_LIMITS": '{"proj.plain": "2/s"}'}
    with workers(broker.url, standalone_url, 1, **env) as started:
        started.wait_ready()
        ids = set(send(app, "proj.plain", 16))
        wait_for(lambda: len(runs(standalone_url)) >= 3, 30)
        with redis.Redis.from_url(broker.url) as client:
            assert client.client_kill_filter(_type="normal", skipme=True) >= 1
        wait_for(lambda: len({r["id"] for r in runs(standalone_url)}) >= 16, 90)
        logs = started.logs()
        # a second delivery would show up within the visibility restore interval
        count = len(runs(standalone_url))
        with pytest.raises(AssertionError):
            wait_for(lambda: len(runs(standalone_url)) > count, 5)
    close_app(app)
    once_each(standalone_url, "proj.plain", ids)
    assert "held task(s) dropped" in logs


class Deliveries:
    """What each delivery of each task carried, as the worker received it."""

    def __init__(self) -> None:
        self.got: dict[str, list[dict[str, Any]]] = {}

    def __call__(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        message = request.message
        self.got.setdefault(request.id, []).append({
            "serializer": request.content_type,
            "encoding": request.content_encoding,
            "compression": (message.headers or {}).get("compression"),
            "argsrepr": request.argsrepr,
            "kwargsrepr": request.kwargsrepr,
            "expires": request.expires,
            "time limits": tuple(request.time_limits or ()),
            "priority": request.delivery_info.get("priority"),
            "exchange": request.delivery_info.get("exchange"),
            "routing key": request.delivery_info.get("routing_key"),
            "reply_to": request.reply_to,
            "custom header": request.request_dict.get("x-trace"),
            "stamps": request.stamps,
            "stamped headers": sorted(request.stamped_headers),
        })  # fmt: skip


@pytest.mark.parametrize("park", [True, False], ids=["parked", "countdown"])
@pytest.mark.parametrize(
    ("task", "conf"),
    [("proj.plain", {"funnel_limits": {"proj.plain": "1/s"}}), ("proj.slow", {})],
    ids=["funnel_limits", "FunnelTask"],
)
def test_republish_keeps_everything_the_task_was_sent_with(
    redis_url: str, redis_client: redis.Redis, task: str, conf: dict[str, Any], park: bool
) -> None:
    """A task published again by the gate arrives with what it was first sent with
    (FunnelTask's re-publish lost the serializer, so pickled tasks failed with
    EncodeError, and argsrepr/kwargsrepr, so hidden arguments showed)."""
    redis_client.flushall()
    other = Queue("other", Exchange("other", type="direct"), routing_key="other.key")
    app = make_app(
        redis_url, redis_url, funnel_max_countdown=0.3, accept_content=["json", "pickle"],
        task_queues=[Queue("proj"), other], funnel_park=park, **conf,
    )  # fmt: skip
    deliveries = Deliveries()
    signals.task_received.connect(deliveries, weak=False)
    expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=60)
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            first = app.tasks[task].apply_async((0,), queue="other")
            sent = app.tasks[task].apply_async(
                (1,), exchange="other", routing_key="other.key", serializer="pickle",
                compression="gzip",
                argsrepr="(<secret>,)", kwargsrepr="{}", expires=expires,
                time_limit=30, soft_time_limit=20, priority=3, reply_to="replies",
                headers={"x-trace": "abc"}, stamped_headers=["tenant"], tenant="t1",
            )  # fmt: skip
            assert first.get(timeout=20) == 0
            assert sent.get(timeout=20) == 1
    finally:
        signals.task_received.disconnect(deliveries)
        close_app(app)
    got = deliveries.got[sent.id]
    assert len(got) >= 2, "published again at least once"
    before, after = got[0], got[-1]
    table = {field: (before[field], after[field]) for field in before}
    print("\n".join(f"{field:15} {pair[0]!r:40} {pair[1]!r}" for field, pair in table.items()))
    changed = {field: pair for field, pair in table.items() if pair[0] != pair[1]}
    assert not changed, changed
    assert before["serializer"] == "application/x-python-serialize"
    assert before["compression"] == "application/x-gzip"
    assert before["argsrepr"] == "(<secret>,)"
    assert (before["exchange"], before["routing key"]) == ("other", "other.key")
    assert before["custom header"] == "abc"
    record = next(r for r in runs(redis_url) if r["id"] == sent.id)
    assert record["requeues"] >= 1


def test_a_deferred_task_never_looks_started(redis_url: str, redis_client: redis.Redis) -> None:
    """track_started: no STARTED and no task_prerun while a task only waits (the worker
    gate holds it; FunnelTask's before_start in the pool made it look started)."""
    redis_client.flushall()
    app = make_app(redis_url, redis_url, task_track_started=True)
    prerun: Counter[str] = Counter()

    def on_prerun(task_id: str = "", **_: Any) -> None:
        prerun[task_id] += 1

    signals.task_prerun.connect(on_prerun, weak=False)
    waiting: set[str] = set()  # states seen before the task really started

    def watch(result: Any) -> bool:
        state = result.state
        if not prerun[result.id]:
            waiting.add(state)
        return bool(result.ready())

    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            results = [app.tasks["proj.slow"].delay(i) for i in range(2)]  # 1 per 2 s
            wait_for(lambda: watch(results[1]))
            assert [r.get(timeout=10) for r in results] == [0, 1]
    finally:
        signals.task_prerun.disconnect(on_prerun)
        close_app(app)
    assert waiting == {"PENDING"}
    assert prerun[results[1].id] == 1, "task_prerun only when it really starts"
    record = next(r for r in runs(redis_url) if r["id"] == results[1].id)
    assert record["deferrals"] >= 1


def test_a_gate_error_fails_that_task_and_the_worker_runs_on(
    redis_url: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A funnel_key callable that gives what no key can hold: the task fails with a
    clear error and one log line; the next task runs (the worker used to die with
    'Unrecoverable error')."""
    redis_client.flushall()
    app = make_app(redis_url, redis_url)

    @app.task(
        shared=False, name="proj.bad_key", base=FunnelTask, funnel_rate="10/s",
        funnel_key=lambda n: object(),
    )  # fmt: skip
    def bad(n: int) -> int:
        return n

    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        failed = bad.delay(3)
        with pytest.raises(ConfigurationError, match="funnel_key"):
            failed.get(timeout=20)
        assert app.tasks["proj.limited"].delay(7).get(timeout=20) == 7
    close_app(app)
    lines = [r for r in caplog.records if failed.id in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


@contextmanager
def plain_worker(app: Celery, url: str) -> Iterator[redis_monitor.FunnelLog]:
    """A worker of ``app`` in this process (2 threads) and the log of the decisions of
    ``proj.plain``'s ``funnel_limits`` funnel while it runs."""
    with (
        funnel_log(url, limit_key("funnel:", "proj.plain")) as log,
        start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
    ):
        yield log


def test_a_task_that_expires_while_it_waits_books_nothing_and_ends_expired(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """1 per 2 s: the second task expires after 1 s, before its slot. It books no slot
    (the third task takes the one at 2 s, not 4 s) and ends as Celery's expired tasks
    do: REVOKED, ``task_revoked`` with ``expired=True``."""
    redis_client.flushall()
    app = make_app(redis_url, redis_url, funnel_limits={"proj.plain": "1/2s"})
    revoked: list[dict[str, Any]] = []

    def on_revoked(request: Any = None, **fields: Any) -> None:
        revoked.append({"id": request.id, **fields})

    signals.task_revoked.connect(on_revoked, weak=False)
    key = limit_key("funnel:", "proj.plain")
    try:
        with plain_worker(app, redis_url) as log:
            plain = app.tasks["proj.plain"]
            first = plain.delay(0)
            assert first.get(timeout=30) == 0
            expiring = plain.apply_async((1,), expires=1.0)
            third = plain.delay(2)
            assert third.get(timeout=30) == 2
            wait_for(lambda: expiring.state == "REVOKED")
    finally:
        signals.task_revoked.disconnect(on_revoked)
        close_app(app)
    starts = {r["args"][0]: r["at"] for r in runs(redis_url)}
    assert set(starts) == {0, 2}, "the expired task never ran"
    # on the funnel's clock: the first run's slot, then the third's right after it (the
    # TAT 2 s on), not a slot booked for the expired task between them (4 s on). Was:
    # the third started within 3 s of the first (a loaded machine starts it later)
    writes = log.decisions(key)
    assert writes[-1].tat - writes[0].tat == pytest.approx(2.0, abs=1e-3), writes
    assert [(r["id"], r["expired"]) for r in revoked] == [(expiring.id, True)]


def test_chunks_pay_the_inner_tasks_funnel_per_item(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """20 items of a 10/s FunnelTask in 4 chunks of 5: each chunk pays 5 units before
    it starts, so the items take 1.5 s at least (they all ran at once, unthrottled)."""
    redis_client.flushall()
    app = make_app(redis_url, redis_url)
    key = task_key("funnel:", "proj.limited")
    with (
        funnel_log(redis_url, key) as log,
        start_worker(app, pool="threads", concurrency=4, perform_ping_check=False),
    ):
        chunks = app.tasks["proj.limited"].chunks([(i,) for i in range(20)], 5)
        results = chunks.apply_async()
        assert sorted(n for part in results.get(timeout=60) for n in part) == list(range(20))
    close_app(app)
    starts = sorted(r["at"] for r in runs(redis_url) if r["name"] == "proj.limited")
    assert len(starts) == 20
    # on the funnel's clock: each chunk paid its 5 items at 10/s, one decision moving the
    # TAT 0.5 s. Was: the starts spanned 1.5 s at least (a loaded machine may start the
    # first chunk late)
    moved = [round(step, 2) for _, step in log.steps(key)]
    assert moved == [0.5] * 4, moved


def test_a_task_revoked_while_held_ends_at_once_and_gives_its_slot_back(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """1 per 2 s: the third task (slot at 4 s) is revoked while held. It ends REVOKED
    within the gate's sweep (1 s), not at its slot, and its slot goes to the next task
    (at 4 s, not 6 s)."""
    redis_client.flushall()
    app = make_app(redis_url, redis_url, funnel_limits={"proj.plain": "1/2s"})
    deferred: list[str] = []
    ended: list[str] = []  # the worker let the request go (REVOKED in the backend is at once)

    def on_deferred(task_id: str = "", **_: Any) -> None:
        deferred.append(task_id)

    def on_revoked(request: Any = None, **_: Any) -> None:
        ended.append(request.id)
        ended_at.append(time.time())

    ended_at: list[float] = []
    funnel_signals.task_deferred.connect(on_deferred, weak=False)
    signals.task_revoked.connect(on_revoked, weak=False)
    key = limit_key("funnel:", "proj.plain")
    try:
        with plain_worker(app, redis_url) as log:
            plain = app.tasks["proj.plain"]
            first, second, third = (plain.delay(n) for n in range(3))
            wait_for(lambda: third.id in deferred)
            app.control.revoke(third.id)
            wait_for(lambda: third.id in ended)
            fourth = plain.delay(3)
            assert [r.get(timeout=30) for r in (first, second, fourth)] == [0, 1, 3]
    finally:
        funnel_signals.task_deferred.disconnect(on_deferred)
        signals.task_revoked.disconnect(on_revoked)
        close_app(app)
    starts = {r["args"][0]: r["at"] for r in runs(redis_url)}
    assert set(starts) == {0, 1, 3}, "the revoked task never ran"
    assert third.state == "REVOKED"
    # on the funnel's clock: the first run's slot ends 2 s after it began (its TAT),
    # the third's was at 4 s: let go before it (by the gate's sweep), and the fourth
    # took it (the TAT ends 4 s after the first's, not 6 s). Was: let go within 1.9 s of
    # the revoke and the fourth started within 5 s of the first (a loaded machine's
    # revoke and starts come later)
    writes = log.decisions(key)
    assert ended_at[ended.index(third.id)] < writes[0].tat + 2.0, "let go before its slot"
    assert writes[-1].tat - writes[0].tat == pytest.approx(4.0, abs=1e-3), writes
