"""The end of a run acked late, recorded before its ack, so that the message the broker
gives again after the worker died is dropped, not run a second time.

With ``acks_late`` a run's message is acked after the run: a worker killed between the
body's end and the ack (the result stored, the pool's reply on its way to the main
process: milliseconds, more on a loaded machine) leaves it un-acked, and the broker
gives it again (kombu's Redis transport at its visibility timeout, RabbitMQ when the
connection dies); plain Celery runs it a second time. For a run the worker gate
admitted, the pool process records, as the body ends (``task_postrun``: success,
failure or retry, each of which Celery acks or discards), that its copy ran
(``_stores.copies.Copies.ran``); the gate checks every message the broker gives again
against the task's copies and drops that one. Not recorded: a run killed mid-body (it
runs again: Celery's at-least-once), a run that asked to be given again
(``Reject(requeue=True)``) or was deferred (``Ignore``), an eager or direct call. When
the funnels' Redis fails, nothing is recorded (logged), and while it is known to fail
no run's ack waits on it: the message, if given again, runs again, as without this.

Connected by ``_celery.services`` only for an app with a task that acks late, before
the pool forks.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals, states

from .._config.runtime import runtime_for
from .._gate.state import State, admitted_by_gate
from .._limiter.errors import BackendError
from .._stores.copies import Copies

__all__ = ["acks_late", "connect"]

logger = logging.getLogger("celery_funnel")

# the states of a run that ended, whose message Celery then acks (or discards)
ENDED = frozenset({states.SUCCESS, states.FAILURE, states.RETRY})


def acks_late(app: Any) -> bool:
    """Whether a task of ``app`` acks late (its option, or ``task_acks_late``)."""
    return any(getattr(task, "acks_late", False) for task in list(app.tasks.values()))


def _on_postrun(
    sender: Any = None, task_id: str = "", task: Any = None, state: str = "", **_: Any
) -> None:
    task = task or sender
    if state not in ENDED or task is None or not getattr(task, "acks_late", False):
        return
    request = getattr(task, "request", None)
    if request is None or request.is_eager or request.called_directly:
        return
    headers = getattr(request, "headers", None)
    if not admitted_by_gate(headers):  # the gate did not see it: none checks it again
        return
    runtime = runtime_for(task.app)
    if not runtime.installed or not runtime.settings.redis_url:
        return
    token = State.from_headers(headers).release
    try:
        runtime.outage.check()  # no run's ack waits on a Redis known to fail
        Copies(runtime.funnel.client, runtime.settings.key_prefix).ran([(task_id, token)])
    except BackendError as error:  # logged once an outage (and its probe started)
        runtime.outage.failed(error, "defer")
        _not_recorded(logging.INFO, task.name, task_id, error)
    except Exception as error:  # never fail the run: at-least-once, as without this
        _not_recorded(logging.WARNING, task.name, task_id, error)
    else:
        runtime.outage.answered()


def _not_recorded(level: int, name: str, task_id: str, error: BaseException) -> None:
    logger.log(
        level, "celery-funnel: task %s[%s]: its end was not recorded before its late ack"
        " (%r): if its worker dies before the ack, it may run again", name, task_id, error,
    )  # fmt: skip


def connect() -> None:
    """Connect the receiver that records the ends of runs acked late (once per process)."""
    signals.task_postrun.connect(
        _on_postrun, dispatch_uid="celery_funnel.late_ack_postrun", weak=False
    )
