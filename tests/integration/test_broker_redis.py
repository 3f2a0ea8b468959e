"""Waiting as safe as the broker, on a Redis without an append-only file (issue 42): one
Redis serving as broker (db 1) and funnels' Redis (db 2), two real ``celery worker``
processes of 4 pool processes each. A task parked there is exactly as safe as the tasks
queued beside it, so it is parked: concurrency waiters are handed seats as fast as with
AOF, ``resume`` takes effect within a second, fair share holds, debounce works, and a
restart of that Redis loses no more than plain Celery loses on it. The runs are
recorded in a Redis of their own (``broker_proj``)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_funnel import control
from celery_funnel._config.runtime import runtime_for
from celery_funnel._limiter.keys import concurrency_keys
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.fair_log import fair_log, passed_over
from tests.integration.broker_proj import QUEUE, broker_runs, make_broker_app, send_many
from tests.integration.proj import close_app
from tests.polling import wait_for
from tests.redis_monitor import SeatLog

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])
SAID = "parking is on: the funnels' Redis is the broker's own Redis server"


class Shared:
    """One Redis as broker (db 1) and funnels' Redis (db 2), a record store of its own,
    two workers of 4 processes, and an app to send with."""

    def __init__(self, server: RedisServer, store: RedisServer, prefix: str = "w") -> None:
        base = server.url.rsplit("/", 1)[0]
        self.server, self.store = server, store.url
        self.broker, self.funnels = f"{base}/1", f"{base}/2"
        env = {
            "FUNNEL_TEST_BROKER": self.broker, "FUNNEL_TEST_REDIS": self.funnels,
            "FUNNEL_TEST_STORE": self.store,
        }  # fmt: skip
        self.app: Celery = make_broker_app(self.broker, self.funnels, self.store)
        self.workers = CeleryWorkers(
            "tests.integration.broker_proj", 2, env, "-c", "4", "-Q", QUEUE, cwd=ROOT,
            prefix=prefix,
        )  # fmt: skip

    def __enter__(self) -> Shared:
        self.workers.start()
        self.workers.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.workers.stop()
        finally:
            close_app(self.app)

    def send(self, name: str, count: int, first: int = 0, **kwargs: str) -> list[str]:
        return send_many(self.app, name, count, first, **kwargs)

    def runs(self, name: str) -> list[dict[str, object]]:
        return broker_runs(self.store, name)

    def runs_all(self) -> list[dict[str, object]]:
        return broker_runs(self.store)

    def parked(self) -> int:
        with redis.Redis.from_url(self.funnels) as client:
            return ParkStore(client, "funnel:").count()

    def queued(self) -> int:
        with redis.Redis.from_url(self.broker) as client:
            return int(client.llen(QUEUE))


@pytest.fixture
def store() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def shared() -> Iterator[Shared]:
    """One shared Redis without AOF, its workers started, for the module's tests."""
    with RedisServer() as server, RedisServer() as store, Shared(server, store) as made:
        wait_for(lambda: made.workers.logs().count(SAID) >= 2, 30)
        yield made


def ran(made: Shared, name: str, count: int) -> bool:
    return len(made.runs(name)) >= count


def said_in(made: Shared, said: str) -> bool:
    return said in made.workers.logs()


def seats(made: Shared, count: int = 60) -> tuple[float, list[float], list[int]]:
    """Once ``count`` tasks of 0.2 s sent to 3 seats ran: tasks/s (first start to last
    end), the hand-offs (each start after the first 3, less the end that freed its
    seat), and how many times each run was parked (its ``requeues``)."""
    wait_for(lambda: len(made.runs("bp.seat")) >= count, 120)
    runs = made.runs("bp.seat")
    starts = sorted(float(r["at"]) for r in runs)  # type: ignore[arg-type]
    ends = sorted(float(r["end"]) for r in runs)  # type: ignore[arg-type]
    rate = count / (ends[-1] - starts[0])
    hand_offs = [start - ends[i] for i, start in enumerate(starts[3:])]
    return rate, hand_offs, [int(r["requeues"]) for r in runs]  # type: ignore[call-overload]


def test_concurrency_waiters_are_handed_seats_as_fast_as_with_aof() -> None:
    """funnel_concurrency=3, 60 tasks of 0.2 s, two workers of 4 processes, on the
    broker's own Redis without AOF and, side by side in the same run, on one with AOF
    (the machine's load falls on both alike): the waiters are parked and promoted (no
    0.5 s polling): read on each funnels' Redis (MONITOR), no script leaves a seat free
    while a waiter that holds none waits, and seats go in the order the waiters queued;
    the throughput at least 0.9 of the AOF figure (6.1 tasks/s before, against
    13.0-13.2 with AOF). Was also: the median hand-off (a start less the end that freed
    its seat, the workers' clock) within 100 ms: how fast a loaded machine publishes,
    delivers and starts a promoted task; the hand-off itself is read on Redis now."""
    with contextlib.ExitStack() as stack:
        made: dict[bool, Shared] = {}
        logs: dict[bool, SeatLog] = {}
        for aof in (False, True):
            server = stack.enter_context(RedisServer(aof=aof))
            store = stack.enter_context(RedisServer())
            made[aof] = stack.enter_context(Shared(server, store, "a" if aof else "n"))
        for aof, shared in made.items():
            said = "has an append-only file" if aof else SAID
            wait_for(partial(said_in, shared, said), 30)
            keys = concurrency_keys(runtime_for(shared.app).task_key("bp.seat", ""))
            logs[aof] = SeatLog(shared.funnels, keys.leases, keys.waiters, 3)
            logs[aof].start()
            stack.callback(logs[aof].stop)
        for shared in made.values():
            shared.send("bp.seat", 60)
        figures = {aof: seats(shared) for aof, shared in made.items()}
        for log in logs.values():
            log.sync()
    (rate, hand_offs, requeues), (aof_rate, aof_hand_offs, _) = figures[False], figures[True]
    ratio = rate / aof_rate
    print(
        f"measured: no AOF, the broker's Redis: {rate:.2f} tasks/s, hand-off median"
        f" {statistics.median(hand_offs) * 1000:.0f} ms; AOF: {aof_rate:.2f} tasks/s, median"
        f" {statistics.median(aof_hand_offs) * 1000:.0f} ms; ratio {ratio:.2f}"
    )
    assert sum(1 for n in requeues if n) >= 40, "the waiters were parked, not held"
    for aof, log in logs.items():
        assert len(log.queued) >= 50, "the waiters were queued"
        short = log.short
        assert short == [], f"a seat left free while a waiter waited ({aof=}): {short[:5]}"
        assert list(log.handed) == list(log.queued), "seats handed in the order runs queued"
    assert ratio >= 0.9, ratio


def test_resume_takes_effect_within_a_second(shared: Shared) -> None:
    """Code limit 5/s, 60 tasks sent, paused after the first 5 started, resumed 2 s
    later: the paused tasks were parked, and starts begin again within 1 s of
    ``resume`` returning (none in the 5 s after it before), every task once."""
    shared.send("bp.paced", 60)
    wait_for(lambda: len(shared.runs("bp.paced")) >= 5, 30)
    control.pause(shared.app, "bp.paced")
    wait_for(lambda: shared.parked() > 0, 10)  # the waiting tasks park
    time.sleep(2.0)
    control.resume(shared.app, "bp.paced")
    resumed = time.time()
    wait_for(lambda: len(shared.runs("bp.paced")) >= 60, 60)
    starts = [float(r["at"]) for r in shared.runs("bp.paced")]  # type: ignore[arg-type]
    first = min(at for at in starts if at > resumed)
    print(f"measured: first start {first - resumed:.3f} s after `resume` returned")
    # each live thread takes the resume up within REFRESH_SECONDS, and one refresh
    # later rebases the funnel, releases its parked tasks and wakes the releaser (2.4 s
    # before: tasks released to a worker still paused were parked again, and the
    # bookings made before the pause left the slots of the paused tasks empty)
    assert first - resumed <= 1.0
    assert Counter(int(r["n"]) for r in shared.runs("bp.paced")) == Counter(range(60))  # type: ignore[call-overload]


@pytest.mark.timeout(900)  # past its two hang detectors of 300 s: they say what was pending
def test_fair_share_holds(shared: Shared) -> None:
    """A tenant's 20 tasks behind another's 400 on a shared 20/s: read on the funnels'
    Redis in the order it ran them, each of the small tenant's tasks waited behind at
    most one of the big tenant's for each of its own ahead of it, and one more (stride
    order; without fair share, behind the whole backlog). Was: the last of the 20
    started within 3 s of being sent (15.8 s before, 2.2 s with AOF; the workers' clock:
    how soon a loaded machine parks and starts them)."""
    key = runtime_for(shared.app).task_key("bp.fair", "")
    with fair_log(shared.funnels, key) as log:
        shared.send("bp.fair", 400, tenant="big")
        # deadlines that detect a hang (a loaded machine parks 400 in well under 60 s)
        wait_for(
            lambda: shared.queued() == 0 and shared.parked() >= 300, 300,
            lambda: f"{shared.queued()} queued, {shared.parked()} parked",
        )  # fmt: skip
        sent = time.time()
        shared.send("bp.fair", 20, first=1000, tenant="small")
        small = partial(started_of, shared, "small")
        wait_for(lambda: len(small()) >= 20, 300, lambda: f"{len(small())} of 20 started")
    print(f"measured: the small tenant's last start {max(small()) - sent:.2f} s after its send")
    behind = passed_over(log, "small")
    assert behind == [], f"the small tenant's tasks waited behind more: {behind[:3]}"
    assert sum(slot.tenant == "small" for slot in log.slots) == 20
    shared.app.control.purge()
    with redis.Redis.from_url(shared.funnels) as client:
        ParkStore(client, "funnel:").purge("bp.fair")


def started_of(shared: Shared, tenant: str) -> list[float]:
    """When each run of ``tenant``'s ``bp.fair`` tasks started."""
    return [float(r["at"]) for r in shared.runs("bp.fair") if r["tenant"] == tenant]  # type: ignore[arg-type]


def test_a_debounced_send_is_accepted_and_runs_once(shared: Shared) -> None:
    """Debounce on the broker's own Redis: three sends of one key within its window
    are accepted (no ConfigurationError), share one id, and run once with the last."""
    task = shared.app.tasks["bp.debounced"]
    results = [task.delay(n, key="k") for n in range(3)]
    assert len({r.id for r in results}) == 1
    wait_for(lambda: len(shared.runs("bp.debounced")) >= 1, 20)
    time.sleep(1.5)  # nothing more comes
    (run,) = shared.runs("bp.debounced")
    assert run["n"] == 2
    assert run["id"] == results[0].id


def quiet(made: Shared, seconds: float = 5.0, most: float = 90.0) -> list[dict[str, object]]:
    """The runs, once none was added for ``seconds`` (at most ``most`` seconds)."""
    deadline, count, since = time.monotonic() + most, -1, time.monotonic()
    while time.monotonic() < deadline:
        now = len(made.runs_all())
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            break
        time.sleep(0.25)
    return made.runs_all()


def test_a_restart_of_the_shared_redis_loses_no_more_than_celery(store: RedisServer) -> None:
    """200 tasks at 20/s on two workers, the shared Redis (no AOF) SIGKILLed and started
    again once 60 ran: plain Celery (its own ``rate_limit``, 10/s per worker) loses what
    was queued in that Redis and what its workers had taken and not started (dropped
    at the reconnect, as its ETA timers are, and gone from the broker); celery-funnel
    (``funnel_rate="20/s"``) loses the same: its parked tasks were in that Redis beside
    the queue, its held tasks are dropped at the reconnect as Celery's are. Neither
    runs a task twice. The kill lands within half a second of the 60th run: up to 10
    tasks (20/s) between the two measures are the timing, not a loss."""
    lost, twice = {}, {}
    for name in ("bp.plain", "bp.limited"):
        with RedisServer() as server, Shared(server, store) as made:
            with redis.Redis.from_url(store.url) as client:
                client.flushall()
            ids = set(made.send(name, 200))
            wait_for(partial(ran, made, name, 60), 60)
            server.kill()
            server.start()
            runs = [r for r in quiet(made) if r["id"] in ids]
            counts = Counter(r["id"] for r in runs)
            lost[name] = len(ids) - len(counts)
            twice[name] = sum(n - 1 for n in counts.values())
    print(f"measured: lost {lost}, run twice {twice} (of 200, the Redis killed after 60 ran)")
    assert twice == {"bp.plain": 0, "bp.limited": 0}
    assert lost["bp.limited"] <= lost["bp.plain"] + 10
