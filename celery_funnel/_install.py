"""``install(app)``: wire celery-funnel into a Celery app, once."""

from __future__ import annotations

from typing import Any

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
        runtime.installed = True
    return app
