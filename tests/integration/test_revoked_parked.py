"""A parked task revoked is dropped when the workers see the revoke, not at its release
time: on two real workers, on a Redis broker and on RabbitMQ, a run of a 1/h funnel
parked for an hour is REVOKED within seconds of ``revoke``, leaves the parked store,
and never runs; the first run ran once."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from celery_funnel._stores.park import ParkStore
from tests.integration.proj import runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def parked(url: str) -> set[str]:
    with redis.Redis.from_url(url) as client:
        return {entry.task_id for entry in ParkStore(client, "funnel:").entries()}


def test_a_revoked_parked_task_is_revoked_at_once(on_broker: Celery, standalone_url: str) -> None:
    app = on_broker
    first = app.tasks["proj.hourly"].delay(0)
    assert first.get(timeout=30) == 0  # the hour's one run; the next waits an hour
    second = app.tasks["proj.hourly"].delay(1)
    wait_for(lambda: second.id in parked(standalone_url), 30)  # its slot: an hour away
    app.control.revoke(second.id)
    # the releasers see the revoke within a pass (a second), not in an hour
    wait_for(lambda: second.state == "REVOKED", 15)
    wait_for(lambda: second.id not in parked(standalone_url), 5)
    assert [run["id"] for run in runs(standalone_url)] == [first.id]
