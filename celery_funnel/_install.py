"""``install(app)``: wire celery-funnel into a Celery app, once."""

from __future__ import annotations

from typing import Any

from celery import signals

from ._runtime import runtime_for

__all__ = ["install"]


def install(app: Any) -> Any:
    """Register celery-funnel with ``app`` and return it; calling it again does nothing.

    Adds the consumer bootstep that checks the ``funnel_*`` settings and task options
    at worker start (failing it with the setting's name and value) and enforces
    ``funnel_limits`` for every matching task. Settings are read when first needed,
    so ``app.conf`` may be filled in after this call.
    """
    from .worker import FunnelGate  # noqa: PLC0415 - celery.bootsteps only when installing

    runtime = runtime_for(app)
    if not runtime.installed:
        app.steps["consumer"].add(FunnelGate)
        signals.celeryd_init.connect(_on_worker_init, weak=False)
        runtime.installed = True
    return app


def _on_worker_init(instance: Any = None, options: Any = None, **_: Any) -> None:
    # `celery worker -E` reaches the worker, not app.conf; this runs before the pool
    # forks, so the pool processes that defer tasks know to send events too.
    app = getattr(instance, "app", None)
    if app is not None and (options or {}).get("task_events"):
        runtime_for(app).observer.events = True
