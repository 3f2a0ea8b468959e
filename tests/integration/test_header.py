"""The ``celery_funnel`` header belongs to the messages the gate publishes (issue 28): on
real workers, under a deferring and a parking funnel, on Redis and RabbitMQ brokers, no
message a run sends (a chain's next link, a chord's body, a group, a task sent from the
body, a retry, a replacement) carries a header its gate did not give it, and each runs
once. Every run records what its request's ``celery_funnel`` header said
(``header_proj``)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu.connection import Connection
from kombu.entity import Queue

from celery_funnel._shared.state import HEADER, State
from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.conftest import nothing_left
from tests.integration.header_proj import KIDS, PARENTS, REPLACEMENTS, make_app, seen_runs
from tests.integration.proj import close_app
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])
FUNNELS = pytest.mark.parametrize("park", [False, True], ids=["deferring", "parking"])


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def expected() -> Counter[str]:
    """Every run's label, once."""
    parents = (*PARENTS, 10, 11, 12, 13, 14, 15)
    labels = [f"parent:{n}" for n in parents]
    labels += [f"{kid}:{n}" for kid in KIDS for n in parents]
    labels += ["send-all", "link:10", "chord-body:11", "callback:13"]
    labels += [f"{run}-fresh:{n}" for run in ("first", "retry") for n in range(4)]
    labels += [f"{run}-same:{n}" for run in ("first", "retry") for n in range(6)]
    labels += [f"replacer-{into}:{n}" for n, into in enumerate(REPLACEMENTS)]
    labels += [f"replacer-child:{n}" for n, into in enumerate(REPLACEMENTS) if into != "child"]
    labels += [f"replace:{n}" for n in range(len(REPLACEMENTS))]
    labels += [f"replace-link:{n}" for n, into in enumerate(REPLACEMENTS) if into == "chain"]
    labels += [f"replace-header:{n}" for n, into in enumerate(REPLACEMENTS) if into == "chord"]
    labels += [f"leased:{n}" for n in range(3)] + [f"leased-child:{n}" for n in range(3)]
    return Counter(labels)


def check(recorded: list[dict[str, Any]], park: bool) -> None:
    """Each run once; none carries a header its gate did not give it."""
    assert Counter(r["label"] for r in recorded) == expected()
    wrong = [f"{r['label']}: {r['header']}" for r in recorded if not own(r, park)]
    assert not wrong, f"{len(wrong)} of {len(recorded)} runs: {wrong}"


def own(run: dict[str, Any], park: bool) -> bool:
    """Whether ``run`` carried only what its own gate gave it."""
    header, label = run["header"], run["label"]
    if run["name"] in ("hdr.child", "hdr.send_all"):  # no gate decides them
        return header is None
    if run["name"] == "hdr.funnelled_child" or label.startswith("retry-fresh"):
        # admitted on arrival: a fresh header, whatever its parent or first run had
        fresh = State.from_headers({HEADER: header}) == State()
        return fresh and "promised" not in header
    if label.startswith("retry-same"):  # it waited once more, for itself: held once,
        # or parked and then held from its early release to its slot
        return bool(header["deferrals"] <= (2 if park else 1) + header["stale"])
    return True


def run_all(broker_url: str, funnel_url: str, queue: str, park: bool) -> list[dict[str, Any]]:
    """``send_all`` through one worker (two prefork processes); every run recorded."""
    env = {
        "FUNNEL_TEST_BROKER": broker_url, "FUNNEL_TEST_REDIS": funnel_url,
        "FUNNEL_TEST_QUEUE": queue, "FUNNEL_TEST_RATE": "2/s",
        # waits past 1 s are parked, or all are held in the worker (a waiter for a
        # concurrency slot is parked in any case)
        "FUNNEL_TEST_PARK_AFTER": "1" if park else "60",
    }  # fmt: skip
    app = make_app(broker_url, funnel_url, queue=queue)
    total = sum(expected().values())
    try:
        with CeleryWorkers(
            "tests.integration.header_proj", 1, env, "-c", "2", "-Q", queue, cwd=ROOT
        ) as workers:
            # sent by a run of the worker's: the test process subscribes to no result
            app.tasks["hdr.send_all"].apply_async(ignore_result=True)
            try:
                wait_for(lambda: len(seen_runs(funnel_url)) >= total, 60)
            except AssertionError:
                ran = Counter(r["label"] for r in seen_runs(funnel_url))
                lines = [line for line in workers.logs().splitlines() if "celery-funnel" in line]
                raise AssertionError(f"never ran: {expected() - ran}; {lines[-20:]}") from None
        # the workers stopped with nothing left anywhere: no run can come after this,
        # so every run is counted (nothing ran a second time, however late)
        nothing_left(broker_url, funnel_url, queue)
    finally:
        close_app(app)
    return seen_runs(funnel_url)


@FUNNELS
def test_no_run_sends_its_header_on_redis(
    standalone_url: str, broker: RedisServer, park: bool
) -> None:
    check(run_all(broker.url, standalone_url, "hdr", park), park)


@pytest.mark.rabbitmq
@FUNNELS
def test_no_run_sends_its_header_on_rabbitmq(
    amqp_url: str, standalone_url: str, park: bool
) -> None:
    queue = f"funnel-hdr-{uuid.uuid4().hex[:8]}"
    try:
        check(run_all(amqp_url, standalone_url, queue, park), park)
    finally:
        with Connection(amqp_url) as connection:
            Queue(queue, channel=connection.channel()).delete()
