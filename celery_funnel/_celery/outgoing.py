"""Which messages carry the ``celery_funnel`` header: those the gate itself publishes (a
deferred task published again or parked, a parked task released), never what a task's
run sends.

The gate writes its header into the request of every run it admits, and the run's
process (a prefork pool child) reads it there (``FunnelTask.before_start``, the lease
given back at ``task_postrun``). Celery then treats it as one of the run's own headers:
``Context`` keeps every non-Celery key of the request in ``request.headers``, and
``Context.as_execution_options`` hands them to ``Task.signature_from_request``, which
``Task.retry`` publishes (Celery 5.3 to 5.7; chains, chords, groups, ``replace`` and
tasks sent from a body get no headers from the run). User code may copy them too.
Every publish goes through ``amqp.send_task_message``, which sends
``before_task_publish`` with the very headers it then publishes, in the process that
publishes: there, a message published inside a run loses the header unless the gate
is the publisher (``_shared.publish.gate_publishes``).

Every other message gets a mark of its own send (``SEND``, a new one each time a task is
sent; the gate's own publishes keep the one they carry): the copies' records tell two
sends of one task id apart by it (``_shared.publish.origin``), as plain Celery runs both.
A message of a marked run's own task id (a retry, a replacement) is a send of its own
too: a new mark, nothing else of the run's header.

One field outlives a run without a mark (sent by a producer without celery-funnel): a
message of the run's own task id that a gate may park gets the token of the parked
release the run came from, and nothing else. The parked-task store tells copies of a
task apart by its id and that token: without it, the new message would look like the
original delivered again, and be dropped as stale when parked.
"""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from typing import Any

from celery import signals
from celery._state import get_current_worker_task

from .._config.options import concurrency_of, limits_of
from .._config.runtime import runtime_for
from .._shared.charges import matching
from .._shared.follow import FOLLOWS
from .._shared.publish import gate_publishes
from .._shared.state import (
    SEND,
    State,
    carries_state,
    drop_state,
    put_state,
    release_only,
    send_mark,
)

__all__ = ["connect"]


def _on_before_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
    if not isinstance(headers, MutableMapping) or gate_publishes():
        return
    task = get_current_worker_task()
    if task is None:  # not sent by a run (a client, the gate's event loop, the releaser)
        headers[SEND] = uuid.uuid4().hex
        return
    own_id = headers.get("id") == task.request.id  # a retry, a replacement
    lineage = own_id and not send_mark(task.request)  # a run of a producer without marks
    if not lineage:  # a send of its own (a mark copied from a run's headers is not its own)
        headers[SEND] = uuid.uuid4().hex
    if (not carries_state(headers) and not own_id) or not runtime_for(task.app).installed:
        return  # most messages
    drop_state(headers)
    if own_id:  # a retry of a follower that runs its own body follows nothing
        headers.pop(FOLLOWS, None)
    release = _lineage(task, str(headers.get("task") or sender)) if lineage else ""
    if release:
        put_state(headers, release_only(release))


def _lineage(task: Any, name: str) -> str:
    """The release token that a message of the run's own task id, task ``name``, keeps:
    the one the run came with, when a gate may park that task ("" for none)."""
    release = State.from_headers(task.request.headers).release
    return release if release and _parkable(task.app, name) else ""


def _parkable(app: Any, name: str) -> bool:
    """Whether a gate of ``app`` may defer (and so park) task ``name``: a funnel of its
    own, or a matching ``funnel_limits`` entry."""
    settings = runtime_for(app).settings
    if matching(settings.limits, name):
        return True
    if matching(settings.concurrency, name):
        return True
    task = app.tasks.get(name)
    if task is None:
        return False
    try:
        return bool(limits_of(task) or concurrency_of(task) is not None)
    except Exception:  # a bad option fails the task at its gate, named
        return False


def connect() -> None:
    """Connect the receiver that marks each send and keeps runs' headers out of what
    they send (once per process; pool processes inherit it)."""
    signals.before_task_publish.connect(
        _on_before_publish, dispatch_uid="celery_funnel.outgoing_header", weak=False
    )
