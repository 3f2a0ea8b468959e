"""``NewlyRevoked`` on Celery's own ``LimitedSet`` (the type of ``worker_state.revoked``):
each take returns the ids added since the last one, once; an id revoked again comes
back, and so do ids with any insertion time (other workers' clocks)."""

from __future__ import annotations

from celery.utils.collections import LimitedSet

from celery_funnel._celery.revoked import NewlyRevoked


def test_each_id_is_taken_once_newest_first() -> None:
    revoked = LimitedSet(maxlen=100)
    revoked.update(["old"])
    newly = NewlyRevoked(revoked)
    assert newly.take() == ["old"]  # already there at start (a state file's)
    assert newly.take() == []
    revoked.add("a", now=10.0)
    revoked.add("b", now=11.0)
    assert newly.take() == ["b", "a"]
    assert newly.take() == []
    revoked.add("a", now=12.0)  # revoked again
    assert newly.take() == ["a"]


def test_insertion_order_not_time_tells_what_is_new() -> None:
    revoked = LimitedSet(maxlen=100)
    newly = NewlyRevoked(revoked)
    revoked.add("a", now=1e9)  # a clock far ahead
    assert newly.take() == ["a"]
    revoked.add("b", now=20.0)
    assert newly.take() == ["b"]
    revoked.add("c", now=20.0)
    revoked.add("d", now=20.0)  # the same instant
    assert newly.take() == ["d", "c"]
    assert newly.take() == []


def test_a_set_without_its_table_yields_nothing() -> None:
    assert NewlyRevoked(object()).take() == []
