"""The ``celery_funnel`` header in what a run publishes (``_outgoing``), through Celery's
own publish on its in-memory broker: a run's header never goes out with what it sends;
the gate's publishes keep theirs; a retry of a task a gate may park keeps only the
token of the parked release it came from. Every send gets a mark of its own (``SEND``),
which the gate's publishes keep; a retry of a marked run gets one of its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery, signals
from celery._state import _task_stack
from celery.exceptions import Retry

from celery_funnel import FunnelTask, install
from celery_funnel._gate.publish import gate_publishing
from celery_funnel._gate.state import HEADER, SEND

# what a gate wrote into a run's request (a released copy: a release token)
GATE_HEADER = {"deferrals": 2, "booked": True, "release": "t1", "promised": {"k": 1}}


def make_app(installed: bool = True, limits: dict[str, Any] | None = None) -> Celery:
    app = Celery("outgoing", broker="memory://", set_as_current=False)
    app.conf.update(funnel_redis_url="redis://localhost:1", task_ignore_result=True)
    app.conf.funnel_limits = limits or {}
    if installed:
        install(app)

    @app.task(name="o.funnelled", base=FunnelTask, shared=False, bind=True, funnel_rate="1/s")
    def funnelled(self: Any) -> None:
        return None

    @app.task(name="o.plain", shared=False, bind=True)
    def plain(self: Any) -> None:
        return None

    return app


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    """The headers of every message published, as they went out."""
    seen: list[dict[str, Any]] = []

    def record(headers: Any = None, **_: Any) -> None:
        seen.append(dict(headers))

    signals.after_task_publish.connect(record, weak=False)
    yield seen
    signals.after_task_publish.disconnect(record)


@contextmanager
def running(task: Any, header: dict[str, Any] | None = GATE_HEADER) -> Iterator[str]:
    """Inside a worker's run of ``task`` whose request carries ``header``; its id."""
    task_id = str(uuid.uuid4())
    headers = {HEADER: header} if header is not None else {}
    task.push_request(id=task_id, called_directly=False, args=(), kwargs={}, headers=headers)
    _task_stack.push(task)
    try:
        yield task_id
    finally:
        _task_stack.pop()
        task.pop_request()


@pytest.mark.parametrize("name", ["o.funnelled", "o.plain"])
def test_what_a_run_sends_carries_no_header(name: str, published: list[dict[str, Any]]) -> None:
    app = make_app()
    task, other = app.tasks[name], app.tasks["o.plain"]
    with running(task) as task_id:
        other.delay()
        other.apply_async(headers=dict(task.request.headers))  # copied on purpose
        app.tasks["o.funnelled"].apply_async(headers={HEADER: {"booked": True}})
    assert [m["id"] != task_id for m in published] == [True] * 3
    assert [HEADER in m for m in published] == [False] * 3


def test_a_retry_keeps_only_the_release_token_of_a_task_a_gate_may_park(
    published: list[dict[str, Any]],
) -> None:
    app = make_app()
    with running(app.tasks["o.funnelled"]) as task_id, pytest.raises(Retry):
        app.tasks["o.funnelled"].retry(countdown=0)
    with running(app.tasks["o.plain"]), pytest.raises(Retry):  # no gate parks it here
        app.tasks["o.plain"].retry(countdown=0)
    with running(app.tasks["o.funnelled"], {"deferrals": 1}), pytest.raises(Retry):
        app.tasks["o.funnelled"].retry(countdown=0)  # never released: nothing
    assert published[0]["id"] == task_id
    assert published[0][HEADER] == {"release": "t1"}
    assert [HEADER in m for m in published[1:]] == [False, False]


@pytest.mark.parametrize(
    "entry", ["5/s", {"concurrency": 2}], ids=["worker-wide rate", "worker-wide concurrency"]
)
def test_a_retry_of_a_task_only_a_worker_wide_entry_covers_keeps_its_release_token(
    entry: Any, published: list[dict[str, Any]]
) -> None:
    """``o.plain`` has no funnel of its own: a ``funnel_limits`` entry is what lets a
    gate park it, so its retry keeps the release token (without it the retry would be
    dropped as stale when parked); an entry for another pattern does not."""
    app = make_app(limits={"o.pla*": entry, "other.*": entry})
    with running(app.tasks["o.plain"]) as task_id, pytest.raises(Retry):
        app.tasks["o.plain"].retry(countdown=0)
    elsewhere = make_app(limits={"other.*": entry})
    with running(elsewhere.tasks["o.plain"]), pytest.raises(Retry):
        elsewhere.tasks["o.plain"].retry(countdown=0)
    assert published[0]["id"] == task_id
    assert published[0].get(HEADER) == {"release": "t1"}
    assert HEADER not in published[1], "no entry covers it: no gate parks it"


def test_the_gate_and_senders_outside_runs_keep_their_header(
    published: list[dict[str, Any]],
) -> None:
    app, outsider = make_app(), make_app(installed=False)
    with running(app.tasks["o.funnelled"]), gate_publishing():  # deferred by before_start
        app.tasks["o.funnelled"].apply_async(headers={HEADER: {"deferrals": 3}})
    with running(outsider.tasks["o.plain"]):  # an app without celery-funnel: not ours
        outsider.tasks["o.plain"].apply_async(headers={HEADER: {"deferrals": 4}})
    app.tasks["o.plain"].apply_async(headers={HEADER: {"deferrals": 5}})  # a client
    assert [m[HEADER] for m in published] == [{"deferrals": n} for n in (3, 4, 5)]


def test_every_send_has_a_mark_of_its_own_that_the_gates_copies_keep(
    published: list[dict[str, Any]],
) -> None:
    app = make_app()
    funnelled = app.tasks["o.funnelled"]
    one_id = str(uuid.uuid4())
    funnelled.apply_async(task_id=one_id)  # a client: twice with one id
    funnelled.apply_async(task_id=one_id)
    with running(funnelled, {"release": "t1"}) as task_id:
        funnelled.request.headers[SEND] = "the-runs-mark"
        app.tasks["o.plain"].apply_async(headers=dict(funnelled.request.headers))  # copied
        with gate_publishing():  # the gate publishes this run again: its mark goes on
            funnelled.apply_async(task_id=task_id, headers={SEND: "the-runs-mark"})
        with pytest.raises(Retry):
            funnelled.retry(countdown=0)
    marks = [m.get(SEND) for m in published]
    assert all(marks)
    assert marks[0] != marks[1], "two sends of one id: two marks"
    assert marks[2] not in (None, "the-runs-mark"), "another task sent from a run: its own"
    assert marks[3] == "the-runs-mark", "the gate's copy of the run"
    assert marks[4] not in (None, "the-runs-mark"), "a retry of a marked run: a send of its own"
    assert HEADER not in published[4], "and it needs no release token"
