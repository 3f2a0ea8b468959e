"""What the worker gate does to a Celery worker ``Request`` beyond deciding it: fail it as
Celery fails a task, and tell how long it has until it expires."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from billiard.einfo import ExceptionInfo  # type: ignore[import-untyped]
from celery import signals as celery_signals
from celery.worker.state import task_ready

__all__ = ["EXPIRY_MARGIN_SECONDS", "fail_request", "until_expiry"]

# held until its expiry is this much past, so that Celery sees it expired
EXPIRY_MARGIN_SECONDS = 0.01


def fail_request(request: Any, error: BaseException) -> None:
    """Fail ``request`` with ``error`` as Celery fails a task: FAILURE stored (with its
    errbacks), ``task_failure`` sent, the ``task-failed`` event, the message acked."""
    try:
        raise error
    except BaseException:  # only to capture the traceback
        info = ExceptionInfo()
    task = request.task
    task.backend.mark_as_failure(
        request.id, error, info.traceback, request=request._context,
        store_result=request.store_errors,
    )  # fmt: skip
    celery_signals.task_failure.send(
        sender=task, task_id=request.id, exception=error, args=request.args,
        kwargs=request.kwargs, traceback=info.traceback, einfo=info,
    )  # fmt: skip
    request.send_event("task-failed", exception=repr(error), traceback=info.traceback)
    request.acknowledge()
    task_ready(request)


def until_expiry(request: Any) -> float:
    """Seconds until ``request`` expires (a hair past it), or infinity."""
    expires = request.expires
    if expires is None:
        return float("inf")
    now = datetime.now(timezone.utc if expires.tzinfo else None)
    left: float = (expires - now).total_seconds()
    return max(left, 0.0) + EXPIRY_MARGIN_SECONDS
