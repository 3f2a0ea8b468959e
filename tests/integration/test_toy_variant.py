"""docs/architecture.md's "Recipe: add a concurrency variant", followed from outside the
package: a toy variant (``toy_variant``: one module) registered in the test and by its
worker's project goes through the gate's one entry to concurrency as the built-in
goes: a ``funnel_limits`` entry names it (``"variant": "toy_queue_cap"``), its seats
are taken, started and freed by the built-in steps it keeps, and a run refused a seat
waits by its own ``wait`` (at most ``CAP`` queued; the next ones fail). A real
``celery worker`` runs it. No package file knows its name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_funnel._gate import concurrency
from celery_funnel._gate.concurrency import variant_named
from celery_funnel._limiter.keys import concurrency_keys, limit_key
from celery_funnel.testing import CeleryWorkers
from tests.integration import toy_variant, toy_variant_proj
from tests.integration.proj import close_app, runs
from tests.integration.test_observability import ROOT
from tests.integration.toy_variant import CAP, NAME, QueueFullError
from tests.polling import wait_for

pytestmark = [pytest.mark.redis]


@pytest.fixture
def toy() -> Iterator[None]:
    """``toy_queue_cap`` registered for the test only: the other tests' variants stay
    the built-in one."""
    toy_variant.register_variant()
    try:
        yield
    finally:
        del concurrency._VARIANTS[NAME]


@pytest.fixture
def app(toy: None, standalone_url: str) -> Iterator[Celery]:
    app = toy_variant_proj.make_app(standalone_url, standalone_url)
    yield app
    close_app(app)


def test_an_entry_names_the_toy_variant_once_registered(toy: None) -> None:
    assert isinstance(variant_named(NAME), toy_variant.ToyQueueCap)
    del concurrency._VARIANTS[NAME]
    with pytest.raises(Exception, match="no concurrency variant 'toy_queue_cap'"):
        variant_named(NAME, "funnel_limits['toyq.*']")
    toy_variant.register_variant()


@pytest.mark.slow
def test_a_real_worker_caps_the_queue_by_the_toy_variant(app: Celery, standalone_url: str) -> None:
    """Five runs sent at once to one seat whose variant queues at most two: one runs,
    two wait parked and queued, the last two fail at once (QueueFullError, named); the
    seat then goes to the two waiters in turn, and no two runs ever run at once."""
    env = {"FUNNEL_TEST_BROKER": standalone_url, "FUNNEL_TEST_REDIS": standalone_url}
    key = limit_key("funnel:", "toyq.*")
    with (
        CeleryWorkers(
            "tests.integration.toy_variant_proj", 1, env, "-c", "2", "-Q", "toyq", cwd=ROOT
        ) as workers,
        redis.Redis.from_url(standalone_url) as client,
    ):
        workers.wait_ready()
        results = [app.tasks[toy_variant_proj.TASK].delay(n) for n in range(5)]

        def failed() -> list[Any]:
            return [r for r in results if r.state == "FAILURE"]

        wait_for(lambda: len(failed()) == 5 - 1 - CAP and len(runs(standalone_url)) == 1, 60)
        assert client.zcard(concurrency_keys(key).waiters) == CAP
        client.set(toy_variant_proj.GO, 1)
        wait_for(lambda: sum(r.state == "SUCCESS" for r in results) == 1 + CAP, 60)
        peaks = [int(p) for p in client.lrange(toy_variant_proj.PEAKS, 0, -1)]
    errors = [r.result for r in failed()]
    assert all(isinstance(e, QueueFullError) for e in errors), errors
    assert f"runs wait for a seat of limit:toyq.* already ({NAME}: at most {CAP})" in str(errors[0])
    assert len(runs(standalone_url)) == 1 + CAP, "each run once"
    assert peaks == [1] * (1 + CAP), "one seat: never two runs at once"
