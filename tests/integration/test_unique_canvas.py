"""Unique tasks (``funnel_unique``) inside canvases, on real ``celery worker`` processes
and a real Redis, on a Redis broker and on RabbitMQ (issue 40, item 1): a send that is
part of a chain, a group, a chord's header or has ``link`` callbacks, and finds its key
held, follows the holder and completes with its outcome, so its canvas goes on; each
key's body runs once.

``proj.unique_held`` runs until the test sets ``RELEASE``: the sends of a canvas made
meanwhile find the key held by a run, whatever the machine's load."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group, states

from celery_funnel._config.options import unique_of
from celery_funnel._config.runtime import runtime_for
from celery_funnel._gate.follow import Follow, Next, unique_funnel
from tests.integration.proj import RELEASE, close_app, make_app, runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]

NAME = "proj.unique_held"


def ran(url: str, name: str) -> list[dict[str, Any]]:
    """The runs of task ``name`` recorded so far."""
    return [r for r in runs(url) if r["name"] == name]


def bodies(url: str) -> dict[str, list[str]]:
    """Per key, the ids of the runs of ``proj.unique_held``'s body."""
    found: dict[str, list[str]] = {}
    for record in ran(url, NAME):
        found.setdefault(record["args"][0], []).append(record["id"])
    return found


def running(url: str, *ids: str) -> None:
    """Wait until the body of each task of ``ids`` runs (it holds its key until
    ``release``)."""
    wait_for(lambda: {r["id"] for r in ran(url, NAME)} >= set(ids), 60)


def release(url: str) -> None:
    """Let every run of ``proj.unique_held`` end."""
    with redis.Redis.from_url(url) as client:
        client.set(RELEASE, 1)


def test_a_chain_whose_head_collides_with_a_running_holder_completes(
    standalone_url: str, on_broker: Celery
) -> None:
    """A chain (unique_held("a"), collect) sent while another task runs key "a": its
    head follows that run and completes with its outcome (SUCCESS, the holder's return
    value 1, under an id of its own), and the tail runs with it. Before the fix the head
    published nothing (the send returned the holder's result): the tail never ran and
    the chain's result stayed PENDING for good."""
    task, collect = on_broker.tasks[NAME], on_broker.tasks["proj.collect"]
    holder = task.delay("a", 1)
    running(standalone_url, holder.id)
    result = chain(task.s("a", 2), collect.s()).delay()
    head = result.parent
    assert head.id != holder.id  # a follower, with its own id
    release(standalone_url)
    assert result.get(timeout=60) == 1  # the tail got the holder's return value
    # Celery sends a chain's next task before it stores the result of the one that ran
    # (celery/app/trace.py: "callback tasks must be applied before the result is
    # stored"): a quick tail can end before its head's SUCCESS is stored
    assert head.get(timeout=30) == 1
    assert (head.state, head.result) == (states.SUCCESS, 1)
    assert holder.get(timeout=30) == 1
    assert bodies(standalone_url) == {"a": [holder.id]}, "the key's body ran once"
    assert [(r["id"], r["args"]) for r in ran(standalone_url, "proj.collect")] == [(result.id, [1])]


def test_a_group_of_three_with_one_key_completes_with_one_run(
    standalone_url: str, on_broker: Celery
) -> None:
    """A group of 3 unique_held("a"): the first member takes the key and runs; the other
    two follow it and complete with its outcome: 3 members SUCCESS, [0, 0, 0], one run
    of the body. Before the fix the two other sends published nothing: their members
    stayed PENDING and ``group.get()`` never returned."""
    task = on_broker.tasks[NAME]
    result = group(task.s("a", n) for n in range(3)).delay()
    ids = [member.id for member in result.results]
    assert len(set(ids)) == 3
    running(standalone_url, ids[0])  # the two others wait for it now
    release(standalone_url)
    assert result.get(timeout=60) == [0, 0, 0]
    assert [member.state for member in result.results] == [states.SUCCESS] * 3
    assert bodies(standalone_url) == {"a": [ids[0]]}, "the key's body ran once"


def test_a_chord_with_repeated_keys_in_its_header_runs_its_body_with_every_result(
    standalone_url: str, on_broker: Celery
) -> None:
    """A chord whose header is unique_held a, a, b, b (n = 1, 2, 3, 4): the first of
    each key runs, the second follows it; the body runs once, with every header result
    (the holders' values in the followers' places: [1, 1, 3, 3]); one run per key.
    Before the fix the second send of each key published nothing: the chord counted 2
    of its 4 results and never ran its body."""
    task, collect = on_broker.tasks[NAME], on_broker.tasks["proj.collect"]
    header = [task.s("a", 1), task.s("a", 2), task.s("b", 3), task.s("b", 4)]
    result = chord(header, collect.s()).delay()
    holders = [member.id for member in result.parent.results]
    running(standalone_url, holders[0], holders[2])
    release(standalone_url)
    assert result.get(timeout=60) == [1, 1, 3, 3]
    assert [member.state for member in result.parent.results] == [states.SUCCESS] * 4
    assert bodies(standalone_url) == {"a": [holders[0]], "b": [holders[2]]}, "one run per key"
    assert [(r["id"], r["args"]) for r in ran(standalone_url, "proj.collect")] == [
        (result.id, [[1, 1, 3, 3]])
    ]


def test_a_send_with_a_link_that_collides_with_a_holder_runs_its_callback(
    standalone_url: str, on_broker: Celery
) -> None:
    """unique_held("a", 2) with ``link=collect.s()`` sent while unique_held("a", 1)
    runs: it follows that run, completes with its outcome (1), and its callback runs
    once with it; the key's body ran once. Before the fix the send returned the holder's
    result and published nothing: the callback never ran."""
    task, collect = on_broker.tasks[NAME], on_broker.tasks["proj.collect"]
    holder = task.delay("a", 1)
    running(standalone_url, holder.id)
    sent = task.apply_async(("a", 2), link=collect.s())
    assert sent.id != holder.id  # a follower, with its own id
    release(standalone_url)
    assert sent.get(timeout=60) == 1
    wait_for(lambda: ran(standalone_url, "proj.collect"), 60)
    assert holder.get(timeout=30) == 1
    assert [r["args"] for r in ran(standalone_url, "proj.collect")] == [[1]]
    assert bodies(standalone_url) == {"a": [holder.id]}, "the key's body ran once"


def test_a_follower_that_holds_the_key_itself_goes_on(standalone_url: str) -> None:
    """The gate's check of a follower (``Follow.step``) on a real Redis, each pass as
    the key's holder stands: held by the task followed, it waits; once that task let
    the key go without an outcome, the follower takes the key and runs its own body;
    holding the key itself (its next pass, after a wait for a rate or a seat, or its
    message delivered again), it goes on at once, not after its own claim runs out
    (``funnel_unique_ttl``); taken by a third run after the one followed stored its
    outcome, it completes with that outcome."""
    app = make_app(standalone_url, standalone_url)
    try:
        task = app.tasks[NAME]
        spec = unique_of(task)
        assert spec is not None
        funnel = unique_funnel(task, spec, ("k",), {})
        follow, unique = Follow(runtime_for(app)), runtime_for(app).unique
        request = SimpleNamespace(task=task, args=("k",), kwargs={}, id="follower")
        assert unique.claim(funnel, "followed", spec.ttl)[0]
        assert follow.step(request, "followed") is Next.WAIT, "the one followed holds it"
        assert unique.free(funnel, "followed")  # ended without an outcome (never stored)
        assert follow.step(request, "followed") is Next.OWN, "it takes the key"
        held = unique.holder(funnel)
        assert held is not None
        assert held[0] == "follower"
        assert follow.step(request, "followed") is Next.OWN, "its own key: it goes on"
        assert unique.free(funnel, "follower")
        task.backend.mark_as_done("followed", 7)  # the one followed stored an outcome
        assert unique.claim(funnel, "third", spec.ttl)[0]
        assert follow.step(request, "followed") is Next.COMPLETE
    finally:
        close_app(app)
