"""The gate keeps in mind each run it admitted until its message is acked
(``CopyGuard.watch_ack``), so that the runs a lost broker connection cut off are
recorded as run (``runs_cut``). Real Celery requests over kombu's in-memory transport
(its acks are real), the copies' records on a real Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from celery.worker.request import Request
from kombu.connection import Connection
from kombu.message import Message
from kombu.serialization import dumps

from celery_funnel._config.runtime import runtime_for
from celery_funnel._gate.copies import CopyGuard
from celery_funnel._gate.state import FRESH
from tests.integration.proj import close_app, make_app

RUNS, EVERY = 400, 20  # one run in EVERY is not acked when the connection dies


@pytest.fixture
def app(standalone_url: str) -> Iterator[Celery]:
    app = make_app(standalone_url, standalone_url)
    yield app
    close_app(app)


def started(
    app: Celery, channel: object, tag: int, task_id: str = "", redelivered: bool = False
) -> Request:
    """A request of ``proj.plain`` (task ``task_id``, default a new one) as the worker
    makes it, started in the pool; ``redelivered``: the broker delivers it again."""
    task_id = task_id or uuid.uuid4().hex
    headers, properties, body, _ = app.amqp.as_task_v2(task_id, "proj.plain", (), {})
    content_type, encoding, payload = dumps(body, "json")
    message = Message(
        body=payload, delivery_tag=tag, content_type=content_type,
        content_encoding=encoding, headers=headers, properties=properties, channel=channel,
        delivery_info={"redelivered": redelivered},
    )  # fmt: skip
    request = Request(message, app=app, task=app.tasks["proj.plain"])
    request.time_start = time.time()
    return request


@pytest.mark.parametrize("unconfirmed", [False, True], ids=["acks confirmed", "AMQP"])
def test_only_runs_not_acked_are_recorded_and_an_acked_message_is_let_go(
    app: Celery, unconfirmed: bool
) -> None:
    """A run is forgotten once its message is acked, and the message is left as kombu
    made it (nothing of the gate's on it: no cycle through it, freed at once, not by
    the garbage collector); a cut records only the runs whose ack never went through,
    and on AMQP (acks not confirmed) the runs acked lately too."""
    guard = CopyGuard(runtime_for(app), unconfirmed_acks=unconfirmed)
    channel = Connection("memory://").channel()
    for tag in range(RUNS):
        request = started(app, channel, tag)
        guard.watch_ack(request, FRESH)
        if tag % EVERY:
            request.message.ack()  # as Celery acks: through the message
            assert "ack" not in vars(request.message), "the gate's ack is off the message"
            assert "reject" not in vars(request.message)
    not_acked = RUNS // EVERY
    assert len(guard.unacked) == not_acked
    assert guard.runs_cut() == (RUNS if unconfirmed else not_acked)
    assert guard.unacked == {}


def test_a_run_cut_off_before_its_ack_does_not_run_again_when_delivered_again(
    app: Celery,
) -> None:
    """The broker connection dies while runs' acks are outstanding: each run that
    started is recorded (``runs_cut``), so its message, which the broker delivers again
    (flagged redelivered), is dropped, not run a second time; a message delivered again
    that never ran goes on."""
    guard = CopyGuard(runtime_for(app))
    channel = Connection("memory://").channel()
    cut, acked = started(app, channel, 1), started(app, channel, 2)
    for request in (cut, acked):
        assert guard.accept(request, FRESH) is True, "the message as first sent goes on"
        guard.watch_ack(request, FRESH)
    acked.message.ack()
    assert guard.runs_cut() == 1, "only the run whose ack never went through"
    again = started(app, channel, 3, task_id=cut.id, redelivered=True)
    assert guard.accept(again, FRESH) is False, "the cut run, delivered again: dropped"
    fresh = started(app, channel, 5, redelivered=True)  # delivered again, never run
    assert guard.accept(fresh, FRESH) is True
