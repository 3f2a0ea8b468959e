"""Producer back-pressure: ``funnel_max_waiting=N`` on a FunnelTask. ``delay`` and
``apply_async`` count each task in its funnel's backlog (``_stores.backlog``, per
``funnel_key``) before publishing it, and raise ``TooManyWaitingError`` while N of them
are sent and not yet started. A task leaves the backlog when it starts
(``FunnelTask.before_start``), is revoked or expires, or fails before it starts; an
entry whose leaving was never seen stops counting after an hour."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from celery import signals
from celery._state import get_current_worker_task
from kombu.serialization import loads

from .._config.options import max_waiting_of, option_of, task_name
from .._config.runtime import runtime_for
from .._limiter.errors import TooManyWaitingError
from .._limiter.limit import key_part
from .._shared.publish import gate_publishes

__all__ = ["connect", "enter", "leave", "left_parked", "parked_call"]


def _funnel(task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The funnel whose backlog a run of ``task`` counts in (per ``funnel_key``)."""
    part = key_part(option_of(task, "funnel_key"), task.run, args, kwargs)
    return runtime_for(task.app).task_key(task.name, part)


def enter(task: Any, args: Any, kwargs: Any, options: dict[str, Any]) -> None:
    """Count the task about to be sent (its id set in ``options`` when it has none).
    The gate's own publishes of a task already counted pass; a send of the running
    task's own id (a retry, ``autoretry_for``, a replacement) is counted again without
    the bound: work accepted once is never refused.

    Raises:
        TooManyWaitingError: the funnel's backlog is full (nothing is counted).
        BackendError: the funnels' Redis failed.
    """
    most = max_waiting_of(task)
    if most is None or gate_publishes():
        return
    task_id = options.setdefault("task_id", str(uuid.uuid4()))
    running = get_current_worker_task()
    accepted = running is not None and running.request.id == task_id
    funnel = _funnel(task, args or (), kwargs or {})
    entered, waiting = runtime_for(task.app).backlog.enter(funnel, task_id, most, force=accepted)
    if not entered:
        raise TooManyWaitingError(waiting, most, funnel, task_name(task))


def leave(task: Any, task_id: str, args: Any, kwargs: Any) -> None:
    """The task started, or will never start: it leaves its funnel's backlog.

    Raises:
        BackendError: the funnels' Redis failed.
    """
    if max_waiting_of(task) is not None:
        runtime_for(task.app).backlog.leave(_funnel(task, args or (), kwargs or {}), task_id)


def parked_call(app: Any, message: Mapping[str, Any]) -> tuple[Any, Any, Any] | None:
    """The task, args and kwargs of a parked message (Celery's message protocol 2: a
    body of ``[args, kwargs, embed]``); None when they cannot be read. Never raises."""
    task = app.tasks.get(str((message.get("headers") or {}).get("task")))
    if task is None:
        return None
    try:
        body = loads(  # type: ignore[no-untyped-call]
            message["body"], message["content_type"], message["content_encoding"]
        )
        return task, body[0], body[1]
    except Exception:  # not protocol 2
        return None


def left_parked(app: Any, task_id: str, message: Mapping[str, Any]) -> None:
    """A parked task was dropped (revoked while parked): it leaves its backlog (an
    entry whose arguments cannot be read stops counting within the hour). Never
    raises."""
    call = parked_call(app, message)
    if call is not None and max_waiting_of(call[0]) is not None:
        _ended(call[0], task_id, call[1], call[2])


def _ended(task: Any, task_id: str | None, args: Any, kwargs: Any) -> None:
    if task is None or task_id is None or not runtime_for(task.app).installed:
        return
    try:
        leave(task, task_id, args, kwargs)
    except Exception:  # the entry stops counting after its hour: never fail the worker
        return


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None:
        _ended(sender, request.id, request.args, request.kwargs)


def _on_failure(
    sender: Any = None, task_id: str | None = None, args: Any = None, kwargs: Any = None, **_: Any
) -> None:
    _ended(sender, task_id, args, kwargs)


def connect() -> None:
    """Connect the receivers that let revoked, expired and failed tasks leave their
    backlogs (once per process; a pool process inherits them)."""
    signals.task_revoked.connect(_on_revoked, dispatch_uid="celery_funnel.backlog_revoked")
    signals.task_failure.connect(_on_failure, dispatch_uid="celery_funnel.backlog_failure")
