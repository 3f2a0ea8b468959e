"""The gate of the runs the worker gate did not admit (``FunnelTask.before_start``):
eager runs with ``funnel_throttle_eager``, and workers without the gate. It calls the
same gate core (``_shared.judge``); a refused run waits as the wait policy says
(``WaitPolicy.in_task``): slept in place (eager, or too short to publish), else
published again for the time the funnel names, with everything it was sent with
(``_shared.publish``), the current run ending with ``Ignore``."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from celery.exceptions import Ignore

from .._config.options import dry_run_of, policy_of
from .._config.runtime import Runtime, runtime_for
from .._config.waiting import Way
from .._limiter.errors import BackendError
from .._shared.charges import label_of
from .._shared.copies import CopyGuard, new_token
from .._shared.judge import Ruling, Subject, judge, report_wait
from .._shared.publish import republish
from .._shared.state import State, admitted_by_gate, requeued
from .._stores.copies import CopiesBusyError

__all__ = ["decide", "defer"]

logger = logging.getLogger("celery_funnel")


def decide(task: Any, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """The funnels' decision on the run of ``task`` (a ``FunnelTask``) starting now:
    returns when it may run, raises what fails it, or defers it (``defer``)."""
    request = task.request
    runtime = runtime_for(task.app)
    if request.called_directly or (request.is_eager and not runtime.settings.throttle_eager):
        return
    headers = request.headers or {}
    if admitted_by_gate(headers):
        return  # this worker's gate admitted the run, over every funnel: paid once
    if not task._funnel_limits():
        return
    charges = task._funnel_charges(runtime, args, kwargs)
    subject = Subject(
        task.name,
        task_id,
        policy_of(task, runtime.settings.on_backend_error),
        dry_run_of(task, runtime.settings.dry_run),
        eager=bool(request.is_eager),
    )
    state = State.from_headers(headers)
    while True:
        ruling = judge(runtime, subject, charges, state)
        if ruling.run:
            return
        if ruling.error is not None:
            raise ruling.error
        if runtime.waiting.in_task(ruling.delay, eager=bool(request.is_eager)) is Way.PUBLISH:
            defer(task, runtime, subject, label_of(charges), args, kwargs, ruling)
        # eager mode (throttled on purpose), or under a second on a broker that
        # delays by whole seconds only: wait in place, then redeem the slot
        report_wait(runtime, subject, label_of(charges), ruling, requeued=False)
        time.sleep(ruling.delay)
        state = ruling.state


def defer(
    task: Any,
    runtime: Runtime,
    subject: Subject,
    label: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    ruling: Ruling,
) -> None:
    """Publish the run of ``task`` again for ``ruling.delay`` (capped), as a new copy
    recorded first (``_shared.copies``), and end this one (raises ``Ignore``). Where the
    funnels' Redis cannot record it (it fails, or another send of the task id goes
    first), the copy carries the run's own token: it then goes on as this run's message
    would, delivered again."""
    request = task.request
    countdown = runtime.countdowns.countdown(ruling.delay)
    report_wait(
        runtime, subject, label, ruling, requeued=True,
        send_event=task.send_event if runtime.observer.events else None,
    )  # fmt: skip
    token = new_token()
    try:
        moved = CopyGuard(runtime).move(request, ruling.state, token)
    except (BackendError, CopiesBusyError) as error:
        logger.warning("celery-funnel: task %s[%s]: the copy deferred is not recorded (%s)",
                       task.name, request.id, error)  # fmt: skip
        moved, token = True, ruling.state.release
    properties = request.properties or {}
    if moved:
        republish(
            task, request, args, kwargs, countdown=countdown,
            state=requeued(ruling.state._replace(release=token), countdown),
            content_type=properties.get("content_type"),
        )  # fmt: skip
    runtime.observer.quiet_ignored(request.id)
    raise Ignore()
