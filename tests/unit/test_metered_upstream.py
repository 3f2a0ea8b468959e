"""The test upstream's buckets (``celery_funnel.testing.MeteredUpstream``): a call the
slack lets through leaves its bucket below zero, and the bucket stays there; it is
full only before its first call."""

from __future__ import annotations

from celery_funnel.testing import MeteredUpstream


def statuses(upstream: MeteredUpstream, times: list[float]) -> list[int]:
    return [upstream.admit(n, at)[0] for n, at in enumerate(times)]


def test_a_level_the_slack_took_below_zero_is_not_refilled_to_full() -> None:
    upstream = MeteredUpstream(requests=10.0, request_burst=5.0, tokens=1e9, token_burst=1e9)
    # five from the full bucket; at +0.09 s it holds 0.9, within the slack (0.01 s x 10/s)
    # of one: paid, leaving -0.1; at +0.1 s it holds 0.0: refused
    assert statuses(upstream, [100.0] * 5 + [100.09, 100.1]) == [200] * 6 + [429]


def test_a_bucket_is_full_at_its_first_call_only() -> None:
    upstream = MeteredUpstream(requests=10.0, request_burst=5.0, tokens=1e9, token_burst=1e9)
    assert statuses(upstream, [50.0] * 6) == [200] * 5 + [429]
