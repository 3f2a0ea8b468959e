"""What a running ``FunnelTask`` tells its funnels (the bodies of its public methods):
what it really used (``settle``: ``funnel_settle``), what its upstream said (``feedback``:
``funnel_feedback``; ``backoff``: ``funnel_backoff``, an upstream's 429), and how the
upstream answered (``adapt``: its adaptive funnels' rates)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from .._config.runtime import Runtime, runtime_for
from .._limiter.errors import BackendError, ConfigurationError
from .._limiter.headers import Upstream, backoff_of, read_headers
from .._limiter.strategies import capabilities
from .._shared import adaptive, settling
from .._shared.judge import Ruling, Subject
from .._shared.live import live_for
from .._shared.state import State
from ..signals import task_settled
from . import in_task

__all__ = ["adapt", "backoff", "feedback", "settle"]

logger = logging.getLogger("celery_funnel")


def backoff(task: Any, seconds: float) -> None:
    """``FunnelTask.funnel_backoff``: hold ``task``'s funnels ``seconds`` for every
    worker and defer the run until then (it raises ``Ignore``)."""
    request = task.request
    limits = task._funnel_limits()
    if not limits or not capabilities(limits[0].strategy).holds:
        raise ConfigurationError(
            f"funnel_backoff needs a GCRA funnel on task {task.name!r}"
            f" (funnel_rate set, funnel_strategy 'gcra')"
        )
    runtime = runtime_for(task.app)
    adapt(task, runtime, refused=True)
    args, kwargs = request.args or (), request.kwargs or {}
    keys = task._funnel_keys(runtime, limits, args, kwargs)
    seconds = max(float(seconds), 0.0)
    for limit, key in zip(limits, keys, strict=True):
        rate = limit.rate
        if seconds > 0:
            runtime.funnel.hold(key, limit.capacity - 1, rate.count, rate.period, seconds)
    # the hold voided every booking, this task's too: it books afresh on return
    state = State.from_headers(request.headers)
    state = state._replace(deferrals=state.deferrals + 1, booked=False, passed=())
    subject = Subject(task.name, request.id, runtime.settings.on_backend_error)
    ruling = Ruling(run=False, delay=seconds, state=state)
    in_task.defer(task, runtime, subject, task.name, args, kwargs, ruling)


def settle(task: Any, actual: int | None, named: Mapping[str, int]) -> bool:
    """``FunnelTask.funnel_settle``: False when the funnels' Redis failed."""
    request, runtime = task.request, runtime_for(task.app)
    charges = task._funnel_paid(runtime)
    if charges is None:
        return True
    own = len(task._funnel_limits())
    wanted = settling.resolve(task.name, charges, own, actual, named)
    held = getattr(request, "funnel_settled", None) or {}
    try:
        request.funnel_settled = settling.settle(runtime, charges, held, wanted)
    except BackendError as error:
        logger.warning("celery-funnel: task %s[%s] could not settle: %s", task.name,
                       request.id, error)  # fmt: skip
        return False
    for i, units in wanted.items():
        task_settled.send(
            sender=task.name, task_id=request.id, funnel=charges[i].label,
            limit=charges[i].limit.name, charged=held.get(i, charges[i].cost), actual=units,
        )  # fmt: skip
    return True


def feedback(
    task: Any, headers: Any, status: int | None, names: Mapping[str, str] | None
) -> Upstream:
    """``FunnelTask.funnel_feedback``: the headers read."""
    runtime = runtime_for(task.app)
    upstream = read_headers(headers, time.time())
    charges = task._funnel_paid(runtime)
    try:
        if charges:
            settling.align(runtime, charges, upstream.quotas, names)
    except BackendError as error:
        logger.warning("celery-funnel: task %s[%s] could not read feedback in: %s",
                       task.name, task.request.id, error)  # fmt: skip
    if status == 429:
        backoff(task, backoff_of(upstream))
    if status is not None and 200 <= status < 300:
        adapt(task, runtime, refused=False)
    return upstream


def adapt(task: Any, runtime: Runtime, *, refused: bool) -> None:
    """Report a 429 (``refused``) or a success to the run's adaptive funnels (a
    failure of their Redis is logged: the rates stay as they were)."""
    charges = task._funnel_paid(runtime)
    if not charges or all(c.limit.adaptive is None for c in charges):
        return
    try:
        adaptive.report(runtime, charges, refused, live_for(task.app).adaptive)
    except BackendError as error:
        logger.warning("celery-funnel: task %s[%s] could not adapt its rate: %s",
                       task.name, task.request.id, error)  # fmt: skip
