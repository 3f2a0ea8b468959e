"""Unique tasks (``funnel_unique``): waiting for a run, then sending the same key
again, runs again (issue 40, item 2), on a Redis broker and on RabbitMQ, with real
``celery worker`` processes and a real Redis."""

from __future__ import annotations

from collections import Counter

import pytest
from celery import Celery

from tests.integration.proj import runs
from tests.integration.test_one_gate import once_each

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROUNDS = 15


def test_a_send_after_waiting_for_the_run_runs_again(
    standalone_url: str, on_broker: Celery
) -> None:
    """15 rounds of ``first = t.delay(k); first.get(); again = t.delay(k)`` on one
    key: every ``again`` gets an id of its own and runs (its body runs a second time:
    2 runs a round, 30 in all, each id once). Celery stores a run's result before
    ``task_postrun`` frees its key: before the fix, a send made in between found the
    key held by the finished run and collapsed into it (2 to 5 of 15 ``again`` returned
    ``first``'s id and never ran)."""
    task = on_broker.tasks["proj.unique"]
    pairs: list[tuple[str, str]] = []
    for n in range(ROUNDS):
        first = task.delay("k", 2 * n)
        assert first.get(timeout=30) == 2 * n
        again = task.delay("k", 2 * n + 1)
        pairs.append((first.id, again.id))
        # the next round's first send comes after this one's result too
        assert again.get(timeout=30) == 2 * n + 1, f"round {n}: collapsed into {first.id}"
    collapsed = [n for n, (first_id, again_id) in enumerate(pairs) if again_id == first_id]
    assert collapsed == [], f"rounds whose second send collapsed: {collapsed}"
    ids = {i for pair in pairs for i in pair}
    assert len(ids) == 2 * ROUNDS
    recorded = once_each(standalone_url, "proj.unique", ids)
    assert sorted(r["args"][1] for r in recorded) == list(range(2 * ROUNDS))
    per_round = Counter(r["args"][1] // 2 for r in runs(standalone_url))
    assert per_round == dict.fromkeys(range(ROUNDS), 2)
