"""``install(app)``: wire celery-funnel into a Celery app, once."""

from __future__ import annotations

from typing import Any

from celery import signals

from ._celery import backlog as _backlog
from ._celery import outgoing as _outgoing
from ._celery.checks import NotInstalled, check_definitions, uses_funnel
from ._celery.secrets import mask_conf
from ._config.runtime import runtime_for

__all__ = ["install"]


def install(app: Any) -> Any:
    """Register celery-funnel with ``app`` and return it; calling it again does nothing.

    Adds the consumer bootstep that checks the ``funnel_*`` settings and task options at
    worker start (failing it with the setting's name and value) and enforces
    ``funnel_limits`` for every matching task, the one that releases parked tasks when
    they are due, and the one that reads runtime overrides (``control``) and writes the
    dashboard's counts; checks the ``funnel_*`` options of each later ``@app.task(...)``
    call as it is made (``ConfigurationError`` raised from the decorator line); keeps
    the gate's header out of the messages a run sends (``_celery.outgoing``); masks
    the funnels' Redis password in ``inspect conf``; adds ``inspect funnel_waiting``
    (``_celery.waiting``) and the task ``celery_funnel.follow`` (what a unique task's
    follower completes as, ``_shared.follow``). Settings are read when first needed, so
    ``app.conf`` may be filled in after this call.
    """
    # imported here, not at the top: the worker's side (the gate, the live thread and
    # what they use) is loaded only by an app that installs, never by a mere import
    from ._celery.follow import register as register_follow  # noqa: PLC0415
    from ._celery.waiting import register as register_waiting  # noqa: PLC0415
    from ._celery.worker import FunnelGate, ReleaserStep  # noqa: PLC0415
    from ._ops.live import LiveStep  # noqa: PLC0415
    from ._ops.summary import SummaryStep  # noqa: PLC0415

    runtime = runtime_for(app)
    if not runtime.installed:
        app.steps["consumer"].add(FunnelGate)
        app.steps["consumer"].add(ReleaserStep)
        app.steps["consumer"].add(LiveStep)
        app.steps["consumer"].add(SummaryStep)
        signals.celeryd_init.connect(_on_worker_init, weak=False)
        _outgoing.connect()
        _backlog.connect()
        mask_conf()
        register_waiting()  # celery inspect funnel_waiting
        register_follow(app)  # what followers of unique tasks complete as
        check_definitions(app)
        runtime.installed = True
    return app


def _check_installed(sender: Any = None, **_: Any) -> None:
    # worker_init is sent by every worker (`celery worker` and in-process test workers
    # alike) before its blueprint is built; this module is imported by every `celery`
    # command (the `celery funnel` entry point imports the package), so an app that
    # uses celery-funnel without install(app) is caught even when nothing imports
    # celery_funnel. Celery only logs what a receiver raises: a consumer bootstep that
    # raises stops the worker instead.
    app = getattr(sender, "app", None)
    if app is not None and uses_funnel(app) and not runtime_for(app).installed:
        app.steps["consumer"].add(NotInstalled)


signals.worker_init.connect(_check_installed, dispatch_uid="celery_funnel.installed", weak=False)


def _on_worker_init(instance: Any = None, options: Any = None, **_: Any) -> None:
    # `celery worker -E` reaches the worker, not app.conf; this runs before the pool
    # forks, so the pool processes that defer tasks know to send events too.
    app = getattr(instance, "app", None)
    if app is not None and (options or {}).get("task_events"):
        runtime_for(app).observer.events = True
