"""docs/architecture.md's "Recipe: add a limiter kind", followed from outside the
package: a toy kind (``toy_kind``: one module, and its script ``toy_gap.lua``)
registered in the test goes through what the built-ins go through: its decision table
on every store (the Python twin in memory, the Lua on each Redis and a Cluster), a
chain of decisions with a built-in one, the registry (a limit's ``strategy``, its
capabilities, ``celery funnel check``'s scripts), and a real ``celery worker`` whose
task names it (``funnel_strategy="toy_gap"``). No package file knows its name."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_funnel import ConfigurationError, Funnel, Limit, MemoryFunnel, Rate, RedisFunnel
from celery_funnel._limiter.backends._chain import chain_script
from celery_funnel._limiter.keys import task_key
from celery_funnel._limiter.strategies import CAPABILITIES, _registry, capabilities, fixed_window
from celery_funnel._stores.check import _scripts
from celery_funnel.testing import CeleryWorkers
from tests.integration import toy_kind, toy_proj
from tests.integration.proj import close_app, runs
from tests.integration.test_observability import ROOT
from tests.integration.toy_kind import NAME, SCRIPT, ToyGapOp
from tests.polling import wait_for
from tests.tables import T0, Row, answer_row, play, rows


@pytest.fixture
def toy() -> Iterator[None]:
    """``toy_gap`` registered for the test only: the other tests' choices stay the built-ins."""
    toy_kind.register_kind()
    try:
        yield
    finally:
        del _registry._REGISTRY[NAME]
        del CAPABILITIES[NAME]


def _gap(q: int) -> dict[str, Any]:
    return {"count": 2, "period": 1, "quantity": q}  # one unit keeps it busy 0.5 s


# Worked out by hand from the kind's definition. Decision rows are (limited, limit,
# remaining, retry_after, reset_after, granted), as the built-ins' tables.
TOY_GAP: list[Row] = [
    (0, ToyGapOp, _gap(1), (False, 2, 0, -1.0, 0.5, 1)),
    (0.2, ToyGapOp, _gap(1), (True, 2, 0, 0.3, 0.3, 0)),  # busy until +0.5
    (0.5, ToyGapOp, _gap(2), (False, 2, 0, -1.0, 1.0, 2)),  # two units: busy until +1.5
    (1.0, ToyGapOp, _gap(3), (True, 2, 0, -1.0, 0.5, 0)),  # above the count: never fits
    (1.2, ToyGapOp, _gap(0), (False, 2, 0, -1.0, 0.3, 0)),  # peek
    (1.5, ToyGapOp, _gap(0), (False, 2, 2, -1.0, 0.0, 0)),  # free again
    (1.5, ToyGapOp, _gap(1), (False, 2, 0, -1.0, 0.5, 1)),
    (1.999999, ToyGapOp, _gap(1), (True, 2, 0, 0.000001, 0.000001, 0)),
    (2.0, ToyGapOp, _gap(1), (False, 2, 0, -1.0, 0.5, 1)),
]


def test_the_toy_kinds_table_on_every_store(funnel: Funnel, key: str) -> None:
    """The twin in memory and the Lua on each Redis give the hand-worked answers."""
    for label, method, kwargs, expected in rows("toy-gap", TOY_GAP):
        assert answer_row(play(funnel, key, method, kwargs)) == expected, label


def test_the_toy_kind_chains_with_a_built_in(funnel: Funnel, key: str) -> None:
    """One task's decisions of several kinds go to Redis as one chain script: the toy's
    own text (read from outside the package) is one of its steps."""
    toy, window = f"{{{key}}}:toy", f"{{{key}}}:window"
    steps = [lambda f, t=t: f.decide([ToyGapOp(toy, 2, 1, now=T0 + t)])[0] for t in (0, 0.1)]

    def both(step: Any) -> list[Any]:
        admitted = funnel._decide_in_order(
            [step, lambda f: f.fixed_window(window, 5, 10, now=T0)], lambda d: d.allowed
        )
        return [tuple(d) for d in admitted]

    assert both(steps[0]) == [(False, 2, 0, -1.0, 0.5, 1), (False, 5, 4, -1.0, 10.0, 1)]
    assert both(steps[1]) == [(True, 2, 0, 0.4, 0.4, 0)]  # refused: the window untouched
    assert funnel.fixed_window(window, 5, 10, quantity=0, now=T0).remaining == 4
    chain = chain_script((SCRIPT, fixed_window.SCRIPT))
    assert SCRIPT.body in chain.source
    if isinstance(funnel, RedisFunnel) and isinstance(funnel.client, redis.Redis):
        assert funnel.client.script_exists(chain.sha) == [True]  # one round trip: chained


def test_a_limit_names_the_toy_kind_once_registered(toy: None, key: str) -> None:
    with pytest.raises(ConfigurationError):
        Limit(Rate.parse("2/s"), strategy="toy-gap")
    limit = Limit(Rate.parse("2/s"), strategy=NAME)
    assert capabilities(NAME) == toy_kind.CAN
    assert not capabilities(NAME).books
    clock = [1000.0]
    funnel = MemoryFunnel(clock=lambda: clock[0])
    assert [limit.check(funnel, key, 1).run for _ in range(2)] == [True, False]
    clock[0] += 0.5
    assert limit.check(funnel, key, 1).run


def test_funnel_check_runs_the_toy_kinds_script(toy: None, standalone_url: str) -> None:
    with redis.Redis.from_url(standalone_url) as client:
        client.script_flush()
        assert _scripts(RedisFunnel(client), "funnel:") is None
        assert client.script_exists(SCRIPT.sha) == [True]
        assert client.keys("funnel:*") == []  # its scratch keys gone too


@pytest.fixture
def app(toy: None, standalone_url: str) -> Iterator[Celery]:
    app = toy_proj.make_app(standalone_url, standalone_url)
    yield app
    close_app(app)


@pytest.mark.slow
def test_a_real_worker_limits_a_task_by_the_toy_kind(app: Celery, standalone_url: str) -> None:
    """Six tasks sent at once through "2/s" of toy_gap: each runs once, the starts at
    least 0.5 s apart (the kind's gap), and the funnel's state is the toy's."""
    env = {"FUNNEL_TEST_BROKER": standalone_url, "FUNNEL_TEST_REDIS": standalone_url}
    options = ("-c", "4", "-Q", "toy")
    key = task_key("funnel:", toy_proj.TASK)
    with (
        CeleryWorkers("tests.integration.toy_proj", 1, env, *options, cwd=ROOT) as workers,
        redis.Redis.from_url(standalone_url) as client,
    ):
        workers.wait_ready()
        ids = [app.tasks[toy_proj.TASK].delay(n).id for n in range(6)]
        wait_for(lambda: runs(standalone_url), 40)
        free = client.hget(key, "free")  # toy_gap's state (GCRA's is a string)
        wait_for(lambda: len(runs(standalone_url)) >= 6, 40)
    assert free is not None
    assert int(free) > T0 * 10**6
    done = runs(standalone_url)
    assert sorted(r["id"] for r in done) == sorted(ids)  # each once
    starts = sorted(r["at"] for r in done)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.45, gaps  # 0.5 s apart, less the clocks' jitter
