"""Prometheus metrics for celery-funnel (``pip install celery-funnel[prometheus]``).

Call ``enable()`` once where the app is defined; the worker's processes then count
every decision. Expose them as for any Prometheus client: ``start_http_server(port)``
in a solo or threads worker, or, with the prefork pool, the multiprocess mode of
``prometheus_client`` (set ``PROMETHEUS_MULTIPROC_DIR`` before the worker starts)::

    from celery_funnel import prometheus
    prometheus.enable()

Metrics (label ``funnel``: the task name, or ``limit:<pattern>`` for a worker-wide
limit, or both joined by ``+`` for a run decided over both; never the per-customer
key, so the label stays small):

- ``celery_funnel_admitted_total{funnel}``: tasks that passed their funnel;
- ``celery_funnel_deferred_total{funnel,dry_run}``: tasks made to wait;
- ``celery_funnel_failed_total{funnel,reason}``: tasks the funnel failed (reason: the
  exception class);
- ``celery_funnel_deferral_delay_seconds{funnel}``: histogram of the waits;
- ``celery_funnel_backend_errors_total``: failed calls to the funnel's Redis;
- ``celery_funnel_backend_up``: 0 during an outage, else 1;
- ``celery_funnel_override{funnel,field}``: runtime overrides in force (``control``):
  field ``rate`` (units per second), ``capacity``, ``concurrency`` and ``paused`` (1);
  a funnel without an override has none;
- ``celery_funnel_parked{funnel}``: tasks parked in the funnels' Redis, per funnel;
- ``celery_funnel_settled_units_total{funnel,limit,direction}``: units that
  ``funnel_settle`` gave back (``back``) or charged on top (``extra``), per named limit.
- ``celery_funnel_collapsed_total{funnel,kind}``: sends that published no task of their
  own (kind ``unique``: the key was held; ``debounce``: they joined a waiting run);
- ``celery_funnel_dropped_total{funnel}``: unique tasks a worker dropped (their key was
  held by another task).

``celery_funnel_override`` and ``celery_funnel_parked`` are read by each worker's live
thread about twice a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import signals

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "celery_funnel.prometheus needs prometheus_client: pip install 'celery-funnel[prometheus]'"
    ) from exc

__all__ = ["Metrics", "enable"]

DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


@dataclass(frozen=True)
class Metrics:
    """The metric objects ``enable`` registered."""

    admitted: Counter
    deferred: Counter
    failed: Counter
    delay: Histogram
    backend_errors: Counter
    backend_up: Gauge
    override: Gauge
    parked: Gauge
    settled: Counter
    collapsed: Counter
    dropped: Counter

    def _receivers(self) -> list[tuple[Any, Any]]:
        return [
            (signals.task_admitted, self._on_admitted),
            (signals.task_deferred, self._on_deferred),
            (signals.task_refused, self._on_refused),
            (signals.backend_error, self._on_backend_error),
            (signals.backend_recovered, self._on_backend_recovered),
            (signals.live_refreshed, self._on_live_refreshed),
            (signals.task_settled, self._on_settled),
            (signals.task_collapsed, self._on_collapsed),
            (signals.task_dropped, self._on_dropped),
        ]

    def disconnect(self) -> None:
        """Stop counting (the metrics stay registered)."""
        for signal, receiver in self._receivers():
            signal.disconnect(receiver)
        for registry_id, metrics in list(_enabled.items()):
            if metrics is self:
                del _enabled[registry_id]

    def _on_settled(
        self, sender: Any = None, funnel: str = "", limit: str | None = None, **kw: Any
    ) -> None:
        change = int(kw.get("actual", 0)) - int(kw.get("charged", 0))
        direction = "back" if change < 0 else "extra"
        if change:
            self.settled.labels(funnel=funnel, limit=limit or "", direction=direction).inc(
                abs(change)
            )

    def _on_admitted(self, sender: Any = None, funnel: str = "", **_: Any) -> None:
        self.admitted.labels(funnel=funnel).inc()

    def _on_deferred(
        self, sender: Any = None, funnel: str = "", delay: float = 0.0, **kw: Any
    ) -> None:
        self.deferred.labels(funnel=funnel, dry_run=str(bool(kw.get("dry_run"))).lower()).inc()
        self.delay.labels(funnel=funnel).observe(delay)

    def _on_refused(
        self, sender: Any = None, funnel: str = "", error: Any = None, **_: Any
    ) -> None:
        self.failed.labels(funnel=funnel, reason=type(error).__name__).inc()

    def _on_collapsed(self, sender: Any = None, funnel: str = "", kind: str = "", **_: Any) -> None:
        self.collapsed.labels(funnel=funnel, kind=kind).inc()

    def _on_dropped(self, sender: Any = None, funnel: str = "", **_: Any) -> None:
        self.dropped.labels(funnel=funnel).inc()

    def _on_backend_error(self, sender: Any = None, **_: Any) -> None:
        self.backend_errors.inc()
        self.backend_up.set(0)

    def _on_backend_recovered(self, sender: Any = None, **_: Any) -> None:
        self.backend_up.set(1)

    def _on_live_refreshed(
        self, sender: Any = None, overrides: Any = None, parked: Any = None, **_: Any
    ) -> None:
        self.override.clear()  # an ended override leaves no series behind
        for name, entry in (overrides or {}).items():
            values = {
                "rate": None if entry.rate is None else entry.rate.per_second,
                "capacity": entry.capacity,
                "concurrency": entry.concurrency,
                "paused": 1 if entry.paused else None,
            }
            for field, value in values.items():
                if value is not None:
                    self.override.labels(funnel=name, field=field).set(value)
        self.parked.clear()
        for label, count in (parked or {}).items():
            self.parked.labels(funnel=label).set(count)


_enabled: dict[int, Metrics] = {}


def enable(registry: CollectorRegistry | None = None) -> Metrics:
    """Register celery-funnel's metrics in ``registry`` (default: the global one) and
    count every decision from now on, in this process and the pool processes it forks.
    Calling it again with the same registry returns the same ``Metrics``."""
    registry = REGISTRY if registry is None else registry
    if id(registry) in _enabled:
        return _enabled[id(registry)]
    prefix = "celery_funnel_"
    metrics = Metrics(
        admitted=Counter(
            prefix + "admitted", "Tasks that passed their funnel", ["funnel"], registry=registry
        ),
        deferred=Counter(
            prefix + "deferred", "Tasks made to wait", ["funnel", "dry_run"], registry=registry
        ),
        failed=Counter(
            prefix + "failed", "Tasks the funnel failed", ["funnel", "reason"], registry=registry
        ),
        delay=Histogram(
            prefix + "deferral_delay_seconds",
            "Waits of deferred tasks, seconds",
            ["funnel"],
            buckets=DELAY_BUCKETS,
            registry=registry,
        ),
        backend_errors=Counter(
            prefix + "backend_errors", "Failed calls to the funnel's Redis", registry=registry
        ),
        backend_up=Gauge(
            prefix + "backend_up",
            "0 while the funnel's Redis fails",
            registry=registry,
            multiprocess_mode="min",
        ),
        override=Gauge(
            prefix + "override",
            "Runtime overrides in force (rate per second, capacity, concurrency, paused)",
            ["funnel", "field"],
            registry=registry,
            multiprocess_mode="max",
        ),
        parked=Gauge(
            prefix + "parked",
            "Tasks parked in the funnels' Redis",
            ["funnel"],
            registry=registry,
            multiprocess_mode="max",
        ),
        settled=Counter(
            prefix + "settled_units",
            "Units given back (direction back) or charged on top (extra) by funnel_settle",
            ["funnel", "limit", "direction"],
            registry=registry,
        ),
        collapsed=Counter(
            prefix + "collapsed",
            "Sends that published no task of their own (unique, debounce)",
            ["funnel", "kind"],
            registry=registry,
        ),
        dropped=Counter(
            prefix + "dropped",
            "Unique tasks dropped by a worker (their key was held)",
            ["funnel"],
            registry=registry,
        ),
    )
    metrics.backend_up.set(1)
    for signal, receiver in metrics._receivers():
        signal.connect(receiver, weak=False)
    _enabled[id(registry)] = metrics
    return metrics
