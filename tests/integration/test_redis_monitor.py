"""The tests' reading of the funnel's decisions (``tests.redis_monitor``) on real Redis: a
log started on a funnel booked ahead (an earlier test's) reads its first decision as one
slot from the TAT it found, not as a move of no slot."""

from __future__ import annotations

import uuid

import pytest

from celery_funnel import RedisFunnel
from tests.conftest import SERVERS, ServerPool
from tests.redis_monitor import funnel_log, one_slot_each

ONE_REDIS = True

pytestmark = pytest.mark.redis


def test_a_log_starts_from_the_tat_an_earlier_decision_left_ahead(
    server_pool: ServerPool,
) -> None:
    url = server_pool.url(next(iter(SERVERS)))
    name = f"test:{uuid.uuid4().hex}"
    funnel = RedisFunnel.from_url(url)
    try:
        booked = funnel.limit("2/s", capacity=5, name=name)  # a slot every 0.5 s
        for _ in range(5):  # 5 at once: the TAT is now 2.5 s ahead of Redis's clock
            with booked:
                pass
        with funnel_log(url, "funnel:") as log, booked:
            pass  # full: booked one slot behind the TAT it found
    finally:
        funnel.client.close()
    writes = [w for w in log.decisions() if name in w.key]
    assert len(writes) == 1, "the decisions before the log are in its snapshot only"
    first = log.first_tat(writes[0].key)
    assert first > writes[0].at + 0.5, "the log started on a funnel booked ahead"
    assert [round(moved, 6) for _, moved in log.steps(writes[0].key)] == [0.5]
    assert one_slot_each(writes, 0.5, before=first) == [first]
    with pytest.raises(AssertionError, match="moves of no slot"):
        one_slot_each(writes, 0.5)  # read as if the funnel were new: no slot of 2/s
