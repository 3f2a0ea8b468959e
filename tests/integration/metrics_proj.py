"""The test project (``tests.integration.proj``) with celery-funnel's Prometheus metrics
enabled where the app is defined, as the docs say: ``celery -A
tests.integration.metrics_proj worker`` (with ``PROMETHEUS_MULTIPROC_DIR`` under prefork)."""

from __future__ import annotations

import os

from celery_funnel import prometheus
from celery_funnel._config.runtime import runtime_for
from celery_funnel._limiter.errors import BackendError
from tests.integration.proj import app

__all__ = ["app"]

prometheus.enable()


@app.task(name="metrics.pool_backend_error", shared=False)
def pool_backend_error() -> int:
    """Report a failure of the funnels' Redis in the pool process that runs this, as
    that process's own calls (``funnel_backoff``, an eager run's decision) report one:
    through its outage log, which sends ``backend_error``. Returns the process id."""
    runtime_for(app).outage.failed(BackendError("a pool process's call failed (test)"), "defer")
    return os.getpid()
