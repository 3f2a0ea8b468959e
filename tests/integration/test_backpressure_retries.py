"""Producer back-pressure (``funnel_max_waiting``) and retries (issue 40, item 4): a
retry of a task accepted once is never refused, however full the backlog; on a Redis
broker and on RabbitMQ, with real ``celery worker`` processes and a real Redis."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from celery import Celery, states

from celery_funnel import TooManyWaitingError
from tests.integration.proj import runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]

NAME = "proj.bounded_retrying"
ACCEPTED = 40


def test_a_retry_is_never_refused_while_a_producer_keeps_the_backlog_full(
    standalone_url: str, on_broker: Celery
) -> None:
    """funnel_max_waiting=6 at 10/s, ``autoretry_for``: each first run fails and is
    retried at once. A producer sends without pause (catching TooManyWaitingError)
    until 40 were accepted, so the backlog is full when the retries are sent: every
    accepted task ends SUCCESS with its value, after two runs (retries 0 and 1). Before
    the fix a retry, a send of the running task's own id, was counted like a new send
    and refused: the task failed with TooManyWaitingError (37 of 45 did). The refusals
    carry the figures (waiting, limit, funnel, task)."""
    task = on_broker.tasks[NAME]
    accepted: list[Any] = []
    refused: list[TooManyWaitingError] = []
    while len(accepted) < ACCEPTED:
        try:
            accepted.append(task.delay(len(accepted)))
        except TooManyWaitingError as error:
            refused.append(error)
            time.sleep(0.01)  # paces the sends (this is the load, not a wait for state)
    assert refused, "the backlog was never full"
    wait_for(lambda: all(result.ready() for result in accepted), 120)
    failed = {r.id: repr(r.result) for r in accepted if r.state != states.SUCCESS}
    assert failed == {}, f"{len(failed)} of {ACCEPTED} did not succeed: {failed}"
    assert [result.get(timeout=10) for result in accepted] == list(range(ACCEPTED))
    recorded = Counter((r["id"], r["retries"]) for r in runs(standalone_url) if r["name"] == NAME)
    assert recorded == {(result.id, retries): 1 for result in accepted for retries in (0, 1)}
    funnel = "funnel:{proj.bounded_retrying}"
    assert {(e.limit, e.funnel, e.task) for e in refused} == {(6, funnel, NAME)}
    assert min(e.waiting for e in refused) >= 6
    print(f"\n{len(refused)} sends refused while {ACCEPTED} were accepted")
