"""celery-funnel's own signals, connected to like Celery's::

    from celery_funnel import signals

    @signals.task_deferred.connect
    def on_deferred(sender, task_id, funnel, delay, **kwargs): ...

The ``sender`` of the task signals is the task's name (``connect(sender="proj.fetch")``
filters on it); the backend signals are sent by the Celery app. Receivers run in the
process that made the decision: on a worker, its main process (the worker gate decides
every run, FunnelTask or not); a pool process only for runs the gate did not decide
(eager runs, ``funnel_backoff``). ``funnel`` names the funnels of the decision: the
task's name, ``limit:<pattern>`` for a worker-wide limit, or several joined by ``+``
when a run is decided over several at once. Always accept ``**kwargs``: later versions
may send more.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "backend_error",
    "backend_recovered",
    "live_refreshed",
    "task_admitted",
    "task_collapsed",
    "task_deferred",
    "task_dropped",
    "task_refused",
    "task_settled",
]

task_admitted = Signal(name="task_admitted", providing_args={"task_id", "funnel", "dry_run"})
"""A task passed its funnel. ``funnel``: the task's name, or ``limit:<pattern>`` for a
worker-wide limit."""

task_deferred = Signal(
    name="task_deferred",
    providing_args={
        "task_id", "funnel", "delay", "deferrals", "booked", "outage", "requeued", "dry_run",
        "how",
    },
)  # fmt: skip
"""A task was refused and waits ``delay`` seconds (float): ``requeued`` when it went back
to the broker, else held in the worker. ``deferrals`` counts them so far; ``booked`` when
a slot is reserved under the task id; ``outage`` when the wait is a back-off because the
funnel's Redis failed; ``dry_run`` when the task runs anyway (``funnel_dry_run``);
``how`` it waits: ``"held"`` in the worker, ``"parked"`` in the funnels' Redis, or
``"republished"`` to the broker with a countdown."""

task_refused = Signal(name="task_refused", providing_args={"task_id", "funnel", "error"})
"""The funnel failed a task: ``error`` is the exception it raises
(``CostTooHighError``, ``TooManyDeferralsError`` or, with ``funnel_on_backend_error =
"raise"``, ``BackendError``)."""

task_settled = Signal(
    name="task_settled", providing_args={"task_id", "funnel", "limit", "charged", "actual"}
)
"""A run settled one of its funnels (``FunnelTask.funnel_settle``): ``limit`` is the
limit's name (None for the task's own unnamed funnel), ``charged`` the units it held
for the run before (its estimate, or the last amount settled), ``actual`` what it
holds now."""

task_collapsed = Signal(name="task_collapsed", providing_args={"task_id", "funnel", "kind"})
"""A send did not publish a task of its own (sent in the producer): ``kind``
``"unique"``, the key was held by task ``task_id`` (the caller got its result), or
``"debounce"``, the send replaced the waiting arguments of task ``task_id``."""

task_dropped = Signal(name="task_dropped", providing_args={"task_id", "funnel", "holder"})
"""A worker dropped a unique task (``funnel_unique``) that arrived while task ``holder``
held its key (a send that bypassed ``FunnelTask.apply_async``): acked, marked REVOKED,
never run."""

backend_error = Signal(name="backend_error", providing_args={"error", "policy", "first"})
"""A call to the funnel's Redis failed; ``first`` for the first failure of an outage
(the one that is logged). ``policy``: the ``funnel_on_backend_error`` applied."""

backend_recovered = Signal(name="backend_recovered", providing_args={"downtime"})
"""The funnel's Redis answers again after an outage of ``downtime`` seconds (float)."""

live_refreshed = Signal(name="live_refreshed", providing_args={"overrides", "parked", "queues"})
"""A worker's live thread read the overrides and the parked counts (about twice a
second; the sender is the worker's node name): ``overrides`` maps funnel names to
``control.Override``s in force, ``parked`` funnel labels to how many tasks they hold
parked; ``queues()``, called by a receiver that wants it, maps (queue, how) to the tasks
waiting on a funnel: ``held`` and ``republished`` in this worker, ``parked`` in the
funnels' Redis (every worker's; read at most every 5 s)."""
