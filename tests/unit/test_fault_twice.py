"""The fault matrix's count of second runs that ``acks_late`` makes: only a run the broker
gave again after we killed the worker that had run the task, between the two runs."""

from __future__ import annotations

from typing import Any

from tests.faults.runner import twice_at_a_kill


def _run(task: str, worker: str, at: float, *, redelivered: bool = False) -> dict[str, Any]:
    return {"id": task, "worker": f"{worker}@host", "at": at, "redelivered": redelivered}


def test_a_redelivered_run_after_its_worker_was_killed_is_acks_lates() -> None:
    records = [_run("a", "f1", 10.0), _run("a", "f2", 21.0, redelivered=True)]
    assert twice_at_a_kill(records, {"f1": [10.004]}, {}) == 1


def test_a_second_run_not_redelivered_is_ours() -> None:
    # a copy the gate published again, run beside the original: no kill explains it
    records = [_run("a", "f1", 10.0), _run("a", "f2", 10.5)]
    assert twice_at_a_kill(records, {"f1": [10.2]}, {}) == 0


def test_a_kill_of_another_worker_or_at_another_time_explains_nothing() -> None:
    records = [_run("a", "f1", 10.0), _run("a", "f2", 21.0, redelivered=True)]
    assert twice_at_a_kill(records, {"f2": [10.2]}, {"a": 1}) == 0
    assert twice_at_a_kill(records, {"f1": [9.9, 21.5]}, {"a": 1}) == 0


def test_each_extra_run_is_judged_on_its_own() -> None:
    records = [
        _run("a", "f1", 30.0, redelivered=True),  # out of order: sorted by time
        _run("a", "f1", 10.0),
        _run("a", "f2", 20.0, redelivered=True),
        _run("b", "f2", 5.0),
        _run("b", "f1", 6.0),
    ]
    assert twice_at_a_kill(records, {"f1": [10.1], "f2": [20.1]}, {}) == 2


def test_a_run_published_again_by_the_gate_counts_where_the_brokers_file_shows_a_restore() -> None:
    # the message given again was deferred by the gate and published anew: its run does
    # not say it was redelivered; the broker's file does, once
    records = [_run("a", "f1", 10.0), _run("a", "f2", 21.0), _run("a", "f1", 40.0)]
    kills = {"f1": [10.1], "f2": [21.1]}
    assert twice_at_a_kill(records, kills, {}) == 0
    assert twice_at_a_kill(records, kills, {"a": 1}) == 1
    assert twice_at_a_kill(records, kills, {"a": 2}) == 2
