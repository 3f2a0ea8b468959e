"""FunnelTask on a real in-process worker, a real Redis broker and a real funnel."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group
from celery.contrib.testing.worker import start_worker
from celery.result import _set_task_join_will_block
from celery.signals import before_task_publish
from kombu.asynchronous import set_event_loop

from celery_funnel import ConfigurationError, CostTooHighError, FunnelTask, RedisFunnel
from celery_funnel._limiter.keys import limit_key, task_key
from celery_funnel._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from celery_funnel._shared.state import HEADER, admitted_by_gate
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for
from tests.redis_monitor import (
    Write,
    booked_again_early,
    bookings,
    funnel_log,
    one_slot_each,
    started_early,
)

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)


@pytest.fixture
def worker(project_app: Celery) -> Iterator[Any]:
    with start_worker(
        project_app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=10
    ) as w:
        yield w


def test_throttled_tasks_run_once_each_at_the_funnel_rate(
    project_app: Celery, worker: Any, redis_url: str
) -> None:
    key = task_key("funnel:", "proj.limited")
    with funnel_log(redis_url, key) as log:
        results = [project_app.tasks["proj.limited"].delay(i) for i in range(8)]
        assert sorted(r.get(timeout=20) for r in results) == list(range(8))
    recorded = runs(redis_url)
    assert sorted(r["args"][0] for r in recorded) == list(range(8))  # each ran once
    assert all(r["retries"] == 0 for r in recorded)
    # 10/s, capacity 1, read from the funnel's decisions on Redis's clock: each moves
    # the TAT one 0.1 s slot, and no task starts before its slot's early grace. Was:
    # the first and last starts >= 0.65 s apart on the worker's clock (a first start
    # that load delays shortens that)
    writes = log.decisions(key)
    slots = one_slot_each(writes, 0.1, before=log.first_tat(key))
    starts = [r["at"] for r in recorded]
    assert started_early(starts, slots, DEFAULT_EARLY_SECONDS) == [], "a task ran early"
    # reservation: each deferral booked a slot (none came back before its slot to be
    # deferred again: the churn reservation ends), and a task booked again only when it
    # came back after its booked slot's late grace (a timer late on a loaded machine).
    # Was: deferrals == 1 + stale, where "stale" counts only the tickets the task
    # itself found late, not one that another booking swept as stale before it came
    booked = bookings(writes, 0.1)
    deferred = {r["id"]: r["deferrals"] for r in recorded if r["deferrals"]}
    assert deferred, "some tasks were deferred"
    assert deferred == {task: len(slots) for task, slots in booked.items()}
    again = booked_again_early(writes, 0.1)
    assert again == [], "booked again while its booked slot could still be honoured"


def test_the_worker_gate_defers_a_funnel_task_before_start_sees_it(
    project_app: Celery, redis_url: str
) -> None:
    """The worker gate, not ``FunnelTask.before_start``, decides a FunnelTask's runs:
    ``before_start`` is reached once per task, only by runs that carry the gate's mark
    (so it never judged, deferred or waited in place), and yet runs were deferred."""
    limited = project_app.tasks["proj.limited"]  # 10/s, capacity 1
    original = limited.before_start
    seen: list[tuple[str, bool]] = []  # (task id, admitted by this worker's gate)

    def before_start(task_id: str, args: Any, kwargs: Any) -> None:
        seen.append((task_id, admitted_by_gate(limited.request.headers)))
        original(task_id, args, kwargs)

    limited.before_start = before_start  # the tracer, built at the first run, takes it
    with start_worker(project_app, pool="threads", concurrency=2, perform_ping_check=False):
        results = [limited.delay(i) for i in range(4)]
        assert [r.get(timeout=20) for r in results] == [0, 1, 2, 3]
    judged = [task_id for task_id, admitted in seen if not admitted]
    assert judged == [], "before_start judged runs the worker gate let through unmarked"
    assert sorted(task_id for task_id, _ in seen) == sorted(r.id for r in results)
    assert any(r["deferrals"] for r in runs(redis_url)), "runs were deferred (by the gate)"


def test_deferral_keeps_chain_links_headers_queue_and_priority(
    project_app: Celery, redis_url: str
) -> None:
    limited, collect = project_app.tasks["proj.limited"], project_app.tasks["proj.collect"]
    with start_worker(
        project_app, pool="threads", concurrency=2, perform_ping_check=False,
        shutdown_timeout=10, queues=["other"],
    ):  # fmt: skip
        first = limited.apply_async((1,), queue="other", priority=3, headers={"x-trace": "t1"})
        second = limited.apply_async(
            (2,), queue="other", priority=3, headers={"x-trace": "t2"},
            link=collect.s().set(queue="other"),
        )  # fmt: skip
        flow = chain(limited.s(3).set(queue="other"), collect.s().set(queue="other"))()
        assert first.get(timeout=20) == 1
        assert second.get(timeout=20) == 2
        assert flow.get(timeout=20) == 3
        wait_for(lambda: len(runs(redis_url)) == 5)
    recorded = runs(redis_url)
    by_args = {(r["name"], r["args"][0]): r for r in recorded}
    assert by_args[("proj.limited", 2)]["headers"]["x-trace"] == "t2"
    assert by_args[("proj.limited", 1)]["headers"]["x-trace"] == "t1"
    assert ("proj.collect", 2) in by_args, "the link ran after the deferral"
    assert ("proj.collect", 3) in by_args, "the chain went on after the deferral"
    assert sum(r["deferrals"] for r in recorded) >= 2, "tasks were deferred (queue kept)"
    assert all(r["retries"] == 0 for r in recorded)


def test_chord_completes_after_deferrals(
    project_app: Celery, worker: Any, redis_url: str, redis_client: redis.Redis
) -> None:
    limited, collect = project_app.tasks["proj.limited"], project_app.tasks["proj.collect"]
    # another client takes the funnel's next 0.5 s (5 units of 10/s), so that every
    # member is deferred however late the worker receives it. Was: >= 4 deferrals of
    # the 5, which needed the worker to receive them within 0.1 s of each other
    key = task_key("funnel:", "proj.limited")
    assert not RedisFunnel(redis_client).throttle(key, 4, 10, 1.0, quantity=5).limited
    result = chord(group(limited.s(i) for i in range(5)), collect.s())()
    assert sorted(result.get(timeout=20)) == list(range(5))
    recorded = runs(redis_url)
    members = [r for r in recorded if r["name"] == "proj.limited"]
    assert all(r["deferrals"] >= 1 for r in members), members
    assert [r["name"] for r in recorded].count("proj.collect") == 1


def test_cost_that_can_never_fit_fails_at_once(project_app: Celery, worker: Any) -> None:
    result = project_app.tasks["proj.costly"].delay(3)  # capacity 2
    with pytest.raises(
        CostTooHighError,
        match=r"task proj\.costly\[.+\] costs \[3\] units .* hold \[2\]: it can never run",
    ) as info:
        result.get(timeout=20)
    assert type(info.value).__name__ == "CostTooHighError"
    assert project_app.tasks["proj.costly"].delay(2).get(timeout=20) == 2


def test_retries_untouched_and_on_retry_not_called(project_app: Celery, redis_url: str) -> None:
    calls: list[str] = []
    limited = project_app.tasks["proj.limited"]
    limited.on_retry = lambda *a: calls.append("on_retry")
    with start_worker(project_app, pool="threads", concurrency=2, perform_ping_check=False):
        results = [limited.delay(i) for i in range(4)]
        assert [r.get(timeout=20) for r in results] == [0, 1, 2, 3]
    assert calls == []
    assert {r["retries"] for r in runs(redis_url)} == {0}


def test_direct_calls_and_eager_mode_are_not_throttled(project_app: Celery) -> None:
    limited = project_app.tasks["proj.limited"]
    assert [limited(i) for i in range(5)] == list(range(5))
    assert [limited.apply((i,)).get() for i in range(5)] == list(range(5))


def test_per_customer_keys_are_separate_funnels(
    project_app: Celery, worker: Any, redis_url: str
) -> None:
    task = project_app.tasks["proj.per_customer"]
    results = [task.delay(customer, i) for i, customer in enumerate(["a", "b", "c"])]
    assert [r.get(timeout=20) for r in results] == [0, 1, 2]
    assert all(r["deferrals"] == 0 for r in runs(redis_url)), "one task per funnel: no waiting"


def test_worker_gate_limits_plain_tasks(redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.flushall()
    app = make_app(redis_url, redis_url, funnel_limits={"proj.plain": "10/s"})
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        results = [app.tasks["proj.plain"].delay(i) for i in range(6)]
        assert sorted(r.get(timeout=20) for r in results) == list(range(6))
        other = app.tasks["proj.collect"].delay(7)
        assert other.get(timeout=20) == 7
    starts = sorted(r["at"] for r in runs(redis_url) if r["name"] == "proj.plain")
    assert starts[-1] - starts[0] >= 0.45  # 6 starts at 10/s, capacity 1
    close_app(app)


def test_bad_settings_stop_the_worker_at_start(redis_url: str) -> None:
    app = make_app(redis_url, redis_url, funnel_limits={"proj.plain": "ten per second"})
    try:
        with (
            pytest.raises(
                ConfigurationError, match=r"funnel_limits\['proj\.plain'\].*'ten per second'"
            ),
            start_worker(app, pool="threads", perform_ping_check=False),
        ):
            pass
    finally:
        # A worker that fails to start leaves process-wide state behind: Celery's
        # "inside a worker" flag (later result.get() calls would refuse) and kombu's
        # event loop (the next in-process worker would reuse its hub, whose timer
        # never runs, so ETA tasks would never fire).
        _set_task_join_will_block(False)
        set_event_loop(None)
        close_app(app)


def test_waits_longer_than_the_cap_requeue_at_the_cap_and_keep_their_slot(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    app = make_app(redis_url, redis_url, funnel_max_countdown=0.5, funnel_park=False)
    key = task_key("funnel:", "proj.slow")
    with (
        funnel_log(redis_url, key) as log,
        published("proj.slow") as copies,
        start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
    ):
        results = [app.tasks["proj.slow"].delay(i) for i in range(2)]  # 1 per 2 s
        assert sorted(r.get(timeout=20) for r in results) == [0, 1]
    first, second = sorted(runs(redis_url), key=lambda r: r["at"])
    assert first["deferrals"] == 0
    waited_at_the_cap(log.decisions(key), copies, second)
    close_app(app)


@contextmanager
def published(task: str) -> Iterator[list[dict[str, Any]]]:
    """The ``celery_funnel`` header of every message of ``task`` published in this
    process meanwhile that carries one (the gate's copies of an in-process worker)."""
    found: list[dict[str, Any]] = []

    def sent(sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
        state = (headers or {}).get(HEADER)
        if sender == task and state:
            found.append(dict(state))

    before_task_publish.connect(sent, weak=False)
    try:
        yield found
    finally:
        before_task_publish.disconnect(sent)


def waited_at_the_cap(writes: list[Write], copies: list[dict[str, Any]], run: Any) -> None:
    """A 2 s wait under a 0.5 s cap (``funnel_max_countdown``), read from the funnel's
    decisions on Redis's clock and the copies published: two decisions, the second
    booking the slot 2 s after the first (kept across its copies: nothing booked again),
    the run starting no earlier than that slot's early grace; every copy published with
    a countdown of at most the cap, once per return (none sent back at once, again and
    again: at most 5 returns in 2 s). Was: starts >= 1.9 s apart and >= 4 (or 3)
    deferrals, on the worker's clock: copies that load brings back late need fewer
    returns, and a first start that load delays shortens the gap."""
    assert len(writes) == 2, f"the slot was booked again: {writes}"
    slots = one_slot_each(writes, 2.0)  # after a FLUSHALL
    assert started_early([run["at"]], slots[1:], DEFAULT_EARLY_SECONDS) == []
    assert copies, "published again"
    assert all(0 < copy["waited"] <= 0.5 for copy in copies), copies
    assert run["requeues"] == len(copies) <= run["deferrals"] <= 5, (run, copies)


def test_an_upstream_429_holds_the_funnel_for_every_task(
    project_app: Celery, worker: Any, redis_url: str, redis_client: redis.Redis
) -> None:
    upstream = project_app.tasks["proj.upstream"]  # 100/s, capacity 5
    key = task_key("funnel:", "proj.upstream")
    with funnel_log(redis_url, key) as log:
        first = upstream.delay(0)  # meets a 429, Retry-After 1 s
        # admissions alone keep the key <= 50 ms; the hold makes it ~1 s
        wait_for(lambda: redis_client.pttl(key) > 500)
        later = [upstream.delay(i) for i in range(1, 4)]
        assert [r.get(timeout=20) for r in [first, *later]] == [0, 1, 2, 3]
    starts = {r["args"][0]: r["at"] for r in runs(redis_url)}
    assert len(starts) == 4
    # nothing ran during the hold, read on Redis's clock: hold.lua's write (the TAT a
    # second ahead) lets the next unit fit at its now + 1 s (TAT + T - tau), a booked
    # slot honoured from the early grace before. Was: starts >= 0.8 s after the test
    # saw the hold (its poll, late on a loaded machine, moved that origin)
    hold = next(w for w in log.decisions(key) if w.tat - w.at > 0.5)  # the first such
    resume = hold.tat + (float(hold.argv(1)) - float(hold.argv(2))) / 1e6
    assert resume - hold.at >= 0.99, "a hold of the Retry-After: 1 s"
    early = 0.01  # proj.upstream's early grace: one slot of 100/s
    assert started_early(list(starts.values()), [resume] * 4, early) == [], "ran in the hold"


def test_a_retry_after_of_zero_defers_without_holding(redis_url: str) -> None:
    """``Retry-After: 0`` (an upstream's window just passed): nothing is held, the task
    is deferred once and runs (it failed with a ConfigurationError from the hold)."""
    app = make_app(redis_url, redis_url)
    tries: list[int] = []

    @app.task(base=FunnelTask, bind=True, shared=False, name="t.zero", funnel_rate="100/s")
    def zero(self: Any) -> int:
        tries.append(1)
        if len(tries) == 1:
            self.funnel_backoff(0.0)
        return len(tries)

    try:
        with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
            assert zero.delay().get(timeout=20) == 2
    finally:
        close_app(app)


def test_several_limits_on_one_task_hold_all_at_once(
    project_app: Celery, worker: Any, redis_url: str
) -> None:
    task = project_app.tasks["proj.two_limits"]  # per customer 5/s; 4/s over all
    prefix = task_key("funnel:", "proj.two_limits")
    with funnel_log(redis_url, prefix) as log:
        results = [task.delay(customer, i) for i, customer in enumerate("ababab")]
        assert sorted(r.get(timeout=30) for r in results) == list(range(6))
    recorded = runs(redis_url)
    assert sorted(r["args"][1] for r in recorded) == list(range(6)), "each ran once"
    # read from the funnels' decisions on Redis's clock (a slot is the TAT written less
    # one increment), none started before its slot's early grace. Was: a span >= 1.2 s
    # and gaps >= 0.15 s between starts on the worker's clock, which load moves
    writes = log.decisions()
    [overall] = {w.key for w in writes if not w.key.endswith((":a", ":b"))}
    # 4/s over all binds every run: each decision one 0.25 s slot after the one before
    slots = one_slot_each(
        [w for w in writes if w.key == overall], 0.25, before=log.first_tat(overall)
    )
    assert len(slots) == 6
    early = DEFAULT_EARLY_SECONDS
    assert started_early([r["at"] for r in recorded], slots, early) == []
    for customer in "ab":
        mine = [w.tat - 0.2 for w in writes if w.key.endswith(f":{customer}")]
        # 5/s each: its slots at least 0.2 s apart, and its runs in them
        assert len(mine) == 3
        assert all(b - a >= 0.2 - 2e-6 for a, b in itertools.pairwise(sorted(mine))), mine
        starts = [r["at"] for r in recorded if r["args"][0] == customer]
        assert started_early(starts, mine, early) == [], customer


def test_worker_gate_gives_long_waits_back_to_the_broker(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """A 2 s wait with a 0.5 s cap: published again with the capped countdown, once per
    cap (never rejected back to the queue at once, again and again); it runs once, at
    its slot."""
    redis_client.flushall()
    app = make_app(
        redis_url,
        redis_url,
        funnel_limits={"proj.plain": "1/2s"},
        funnel_max_countdown=0.5,
        funnel_park=False,
    )
    key = limit_key("funnel:", "proj.plain")
    with (
        funnel_log(redis_url, key) as log,
        published("proj.plain") as copies,
        start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
    ):
        results = [app.tasks["proj.plain"].delay(i) for i in range(2)]
        assert sorted(r.get(timeout=20) for r in results) == [0, 1]
    first, second = sorted(runs(redis_url), key=lambda r: r["at"])
    assert len(runs(redis_url)) == 2
    assert not second["headers"].get("redelivered")  # a new message, not a redelivery
    assert first["deferrals"] == 0
    waited_at_the_cap(log.decisions(key), copies, second)
    close_app(app)


def test_a_funnel_task_under_a_worker_wide_limit_satisfies_both(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    app = make_app(redis_url, redis_url, funnel_limits={"proj.limited": "5/s"})  # task: 10/s
    key = limit_key("funnel:", "proj.limited")
    with (
        funnel_log(redis_url, key) as log,
        start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
    ):
        results = [app.tasks["proj.limited"].delay(i) for i in range(6)]
        assert sorted(r.get(timeout=20) for r in results) == list(range(6))
    starts = [r["at"] for r in runs(redis_url)]
    # the 5/s one binds, read from its decisions on Redis's clock: 6 slots 0.2 s apart,
    # none started before its slot's early grace. Was: start gaps >= 0.15 s and a span
    # >= 0.95 s on the worker's clock (a start that load delays closes a gap: 0.148 s)
    writes = log.decisions(key)
    assert len(writes) == 6, "one decision a run on the worker-wide funnel"
    slots = one_slot_each(writes, 0.2, before=log.first_tat(key))
    assert started_early(starts, slots, DEFAULT_EARLY_SECONDS) == [], "a task ran early"
    close_app(app)


def test_task_annotations_set_funnel_options(redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.flushall()
    app = make_app(
        redis_url,
        redis_url,
        task_annotations={"proj.annotated": {"funnel_rate": "5/s", "funnel_capacity": 1}},
    )
    key = task_key("funnel:", "proj.annotated")
    with (
        funnel_log(redis_url, key) as log,
        start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
    ):
        results = [app.tasks["proj.annotated"].delay(i) for i in range(4)]
        assert sorted(r.get(timeout=60) for r in results) == [0, 1, 2, 3]
    starts = sorted(r["at"] for r in runs(redis_url))
    # 5/s, from the annotation, read from the funnel's decisions on Redis's clock: each
    # moves the TAT one slot of 0.2 s, from the TAT before or from now (the script's
    # now, a little before Redis stamped the write), and a task starts no earlier than
    # its slot less the early grace (DEFAULT_EARLY_SECONDS). Was: start gaps >= 0.15 s,
    # which a start delayed by a loaded machine closes (0.145 s seen)
    slots = one_slot_each(log.decisions(key), 0.2, before=log.first_tat(key))
    ahead = started_early(starts, slots, DEFAULT_EARLY_SECONDS)
    assert ahead == [], "no task started before its slot's early grace"
    assert sum(r["deferrals"] for r in runs(redis_url)) == 3
    close_app(app)


def test_eager_runs_wait_in_place_when_configured(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    app = make_app(redis_url, redis_url, funnel_throttle_eager=True)
    limited = app.tasks["proj.limited"]  # 10/s, capacity 1
    key = task_key("funnel:", "proj.limited")
    with funnel_log(redis_url, key) as log:
        assert [limited.apply((i,)).get() for i in range(4)] == [0, 1, 2, 3]
    starts = [r["at"] for r in runs(redis_url)]
    # 4 starts at 10/s, waited in place: 4 slots 0.1 s apart on Redis's clock, none
    # started before its slot's early grace. Was: a span of starts >= 0.28 s
    slots = one_slot_each(log.decisions(key), 0.1, before=log.first_tat(key))
    assert len(slots) == 4
    assert started_early(starts, slots, DEFAULT_EARLY_SECONDS) == []
    close_app(app)
