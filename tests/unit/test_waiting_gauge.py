"""``celery_funnel_waiting{queue,how}`` from a worker's live refresh (issue 43): the
series follow ``queues()``, a queue with nothing waiting any more leaves no series, and
a parked entry's queue is the routing key its message was captured with."""

from __future__ import annotations

import json
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from celery_funnel import prometheus, signals
from celery_funnel._ops.queues import _queue_of_entry, queue_of


def test_the_gauge_follows_the_counts_of_each_refresh() -> None:
    registry = CollectorRegistry()
    metrics = prometheus.enable(registry)
    try:
        counts = {("emails", "held"): 2, ("emails", "parked"): 5, ("reports", "republished"): 1}
        signals.live_refreshed.send(sender="w1", overrides={}, parked={}, queues=lambda: counts)
        value = registry.get_sample_value
        assert value("celery_funnel_waiting", {"queue": "emails", "how": "held"}) == 2
        assert value("celery_funnel_waiting", {"queue": "emails", "how": "parked"}) == 5
        assert value("celery_funnel_waiting", {"queue": "reports", "how": "republished"}) == 1
        counts = {("emails", "parked"): 1, ("reports", "republished"): 0}
        signals.live_refreshed.send(sender="w1", overrides={}, parked={}, queues=lambda: counts)
        assert value("celery_funnel_waiting", {"queue": "emails", "how": "parked"}) == 1
        assert value("celery_funnel_waiting", {"queue": "emails", "how": "held"}) is None
        assert value("celery_funnel_waiting", {"queue": "reports", "how": "republished"}) is None
        # a sender without queues (an older worker's) leaves the gauge as it was
        signals.live_refreshed.send(sender="w1", overrides={}, parked={})
        assert value("celery_funnel_waiting", {"queue": "emails", "how": "parked"}) == 1
    finally:
        metrics.disconnect()


def test_the_queue_of_a_request_and_of_a_parked_entry() -> None:
    assert queue_of(SimpleNamespace(delivery_info={"routing_key": "emails"})) == "emails"
    assert queue_of(SimpleNamespace(delivery_info=None)) == ""
    assert queue_of(None) == ""
    entry = {"routing_key": "emails", "declare": ["emails"], "body": "", "meta": {}}
    assert _queue_of_entry(json.dumps(entry)) == "emails"
    assert _queue_of_entry(json.dumps({**entry, "routing_key": ""})) == "emails"
    assert _queue_of_entry(b"not json") == ""
