"""The test project (``tests.integration.proj``) with celery-funnel's Prometheus metrics
enabled where the app is defined, as the docs say: ``celery -A
tests.integration.metrics_proj worker`` (with ``PROMETHEUS_MULTIPROC_DIR`` under prefork)."""

from __future__ import annotations

from celery_funnel import prometheus
from tests.integration.proj import app

__all__ = ["app"]

prometheus.enable()
