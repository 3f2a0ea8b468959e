"""Two sends of one task id are two tasks, as with plain Celery: each runs once, also
when both wait at once (parked, or published again), and when the id is sent again
after its first send waited and ran. On real workers, on a Redis broker and on
RabbitMQ, parking on and off. Before each send carried its own mark (the
``celery_funnel_send`` header), the copies' records knew a task only by its id (and
its task, parent and nesting): the later send was dropped as a stale copy of the
earlier one."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.conftest import project_on
from tests.integration.proj import runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]

# a wait longer than 1 s is parked (parking on) or published again (parking off)
CONF = {"funnel_max_countdown": 1.0, "funnel_park_after": 0.5}
FILL = 30  # tasks ahead in the 10/s funnel: the sends behind them wait about 2-3 s


@pytest.fixture(
    params=[("redis", True), ("redis", False), ("rabbitmq", True), ("rabbitmq", False)],
    ids=["redis-parked", "redis-published", "rabbitmq-parked", "rabbitmq-published"],
)
def app(
    request: pytest.FixtureRequest, broker: RedisServer, standalone_url: str
) -> Iterator[tuple[Celery, CeleryWorkers]]:
    """The test project's app and two of its workers on a queue of their own."""
    kind, parking = request.param
    url = broker.url if kind == "redis" else request.getfixturevalue("amqp_url")
    env = {
        "FUNNEL_TEST_CONF": json.dumps(CONF), "FUNNEL_TEST_PARK": "1" if parking else "0",
        "FUNNEL_TEST_LIMITS": json.dumps({"proj.plain_retrying": "10/s"}),
    }  # fmt: skip
    with project_on(url, standalone_url, "sends", env, task_ignore_result=True) as both:
        yield both


def fill(app: Celery, name: str = "proj.limited") -> set[str]:
    """Send ``FILL`` tasks ``name`` ahead; their ids."""
    return {app.tasks[name].apply_async((n,)).id for n in range(FILL)}


def ran(url: str, task_id: str) -> Counter[int]:
    """How often each send (its argument) of ``task_id`` ran (its retries included)."""
    return Counter(r["args"][0] for r in runs(url) if r["id"] == task_id)


def runs_of(url: str, workers: CeleryWorkers, task_id: str, count: int, each: int = 1) -> None:
    """Wait until ``count`` sends of ``task_id`` ran ``each`` times; on a timeout, say
    what the workers logged of it."""
    try:
        wait_for(lambda: sorted(ran(url, task_id).values()) == [each] * count, 60)
    except AssertionError:
        told = [line for line in workers.logs().splitlines() if task_id in line]
        raise AssertionError(
            f"sends run: {dict(ran(url, task_id))}; the workers' log lines on {task_id}:\n"
            + "\n".join(told[-40:])
        ) from None


def test_every_send_of_one_task_id_runs_once(
    app: tuple[Celery, CeleryWorkers], standalone_url: str
) -> None:
    """Two sends of one id behind a full funnel (both wait at once), then, once they
    ran, a third send of that id behind a full funnel: each runs once."""
    made, workers = app
    limited, task_id = made.tasks["proj.limited"], uuid.uuid4().hex
    ahead = fill(made)
    limited.apply_async((1001,), task_id=task_id)
    limited.apply_async((1002,), task_id=task_id)
    runs_of(standalone_url, workers, task_id, 2)
    ahead |= fill(made)
    limited.apply_async((1003,), task_id=task_id)
    runs_of(standalone_url, workers, task_id, 3)
    wait_for(lambda: ahead <= {r["id"] for r in runs(standalone_url)}, 60)
    deferred = [r for r in runs(standalone_url) if r["id"] == task_id and r["deferrals"]]
    assert deferred, "the sends of the id waited (parked or published again)"
    assert ran(standalone_url, task_id) == Counter({1001: 1, 1002: 1, 1003: 1})
    counts = Counter(r["id"] for r in runs(standalone_url) if r["id"] in ahead)
    assert set(counts.values()) == {1}, "the tasks ahead ran once each"


def test_two_sends_of_one_task_id_that_retry_each_run_and_retry_once(
    app: tuple[Celery, CeleryWorkers], standalone_url: str
) -> None:
    """``proj.plain_retrying`` (``funnel_limits``: 10/s), whose first run retries at
    once: two sends of one id behind a full funnel each run twice, the run and its
    retry; a retry is a send of its own, which waits its turn like the others."""
    made, workers = app
    name, task_id = "proj.plain_retrying", uuid.uuid4().hex
    ahead = fill(made, name)
    made.tasks[name].apply_async((1001,), task_id=task_id)
    made.tasks[name].apply_async((1002,), task_id=task_id)
    runs_of(standalone_url, workers, task_id, 2, each=2)
    wait_for(lambda: ahead <= {r["id"] for r in runs(standalone_url) if r["retries"]}, 60)
    mine = [r for r in runs(standalone_url) if r["id"] == task_id]
    assert sorted((r["args"][0], r["retries"]) for r in mine) == [
        (1001, 0), (1001, 1), (1002, 0), (1002, 1),
    ]  # fmt: skip
    assert any(r["deferrals"] for r in mine), "they waited (parked or published again)"
    counts = Counter((r["id"], r["retries"]) for r in runs(standalone_url) if r["id"] in ahead)
    assert set(counts.values()) == {1}, "the tasks ahead, and their retries, ran once each"
