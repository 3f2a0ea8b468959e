"""The signal receivers that free a run's seats when it ends (the renewal service's,
``_celery.concurrency_renewal``), connected by ``_celery.services`` where seats are taken.

Where a run's end is seen: ``task_postrun`` in the process that ran the body (a pool
child under prefork: it reads the lease from the run's header), for success, failure,
retry, ``Reject``, ``Ignore`` and the soft time limit; ``task_failure`` and
``task_revoked`` in the worker's main process for a hard time limit, a pool process
lost, a revoke with terminate, or a revoke before the run started.
"""

from __future__ import annotations

from typing import Any

from celery import signals

from .._config.runtime import runtime_for
from .._shared.state import State
from .concurrency_renewal import ATTRIBUTE, RenewalService, renewal_for

__all__ = ["connect"]


def _renewal_of(task: Any) -> RenewalService | None:
    """The task's app's ``RenewalService``, when the app uses concurrency limits here."""
    app = getattr(task, "app", None)
    if app is None or not runtime_for(app).installed or ATTRIBUTE not in app.__dict__:
        return None
    return renewal_for(app)


def _on_postrun(sender: Any = None, task_id: str = "", **_: Any) -> None:
    lease = State.of_run(getattr(sender, "request", None)).lease
    if lease is not None and runtime_for(sender.app).installed:
        renewal_for(sender.app).end(task_id, lease)


def _on_failure(sender: Any = None, task_id: str = "", **_: Any) -> None:
    renewal = _renewal_of(sender)
    if renewal is not None:
        renewal.end(task_id)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    renewal = _renewal_of(sender)
    task_id = getattr(request, "id", None)
    if renewal is not None and task_id:
        renewal.end(task_id)


def connect() -> None:
    """Connect the receivers that free seats (once per process)."""
    signals.task_postrun.connect(
        _on_postrun, dispatch_uid="celery_funnel.lease_postrun", weak=False
    )
    signals.task_failure.connect(
        _on_failure, dispatch_uid="celery_funnel.lease_failure", weak=False
    )
    signals.task_revoked.connect(
        _on_revoked, dispatch_uid="celery_funnel.lease_revoked", weak=False
    )
