"""Prometheus metrics for celery-funnel (its extra: ``pip install '.[prometheus]'``).

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
- ``celery_funnel_deferred_total{funnel,dry_run,how}``: deferrals, not tasks (a task
  made to wait three times counts three); ``how`` it waits: ``held`` in the worker,
  ``parked`` in the funnels' Redis, ``republished`` to the broker with a countdown;
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
- ``celery_funnel_waiting{queue,how}``: tasks waiting on a funnel, per queue (the routing
  key their message came by): ``held`` in this worker, ``republished`` (held by Celery
  as an ETA task in this worker), ``parked`` in the funnels' Redis (the cluster's: every
  worker shows the same count; a waiter for a concurrency seat is parked too). An
  autoscaling signal: the broker's queue length counts held and republished tasks as
  un-acked messages, which no new worker can run (docs/operations.md, "Autoscaling").

``celery_funnel_override``, ``celery_funnel_parked`` and ``celery_funnel_waiting`` are
read by each worker's live thread about twice a second (``parked`` by queue at most every
5 s).

The gauges (``backend_up``, ``override``, ``parked``, ``waiting``) are the worker's own: only the
process that called ``enable()`` (a worker's main process, where the worker gate decides)
sets them. In multiprocess mode, ``backend_up``, ``override`` and ``parked`` are
``livemostrecent``, so that the zeros a prefork pool process leaves for every metric once
it counts anything never show (they carry no time, and the most recent value wins), and
``waiting`` is ``liveall``: one series per process (label ``pid``), so that workers
sharing one ``PROMETHEUS_MULTIPROC_DIR`` each keep their own count (the most recent one
alone showed one worker's held tasks), and the autoscaling query (``sum`` of held and
republished, ``max`` of parked) holds there as across separately scraped workers. A
worker's main process marks itself dead there as it shuts down (its ``live*`` gauges
go); one killed outright leaves its last values until the directory is emptied. The
multiprocess mode cannot remove a series: there, a funnel with nothing parked any more
reads 0, and an ended override reads NaN (``paused`` reads 0).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from celery.signals import worker_shutdown

from . import signals
from ._limiter.words import missing_extra

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.multiprocess import mark_process_dead
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        missing_extra("celery_funnel.prometheus", "prometheus_client", "prometheus-client")
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
    waiting: Gauge
    # the process that sets the gauges (``enable``'s), and the series set so far there
    pid: int = field(default_factory=os.getpid)
    _seen: dict[str, set[tuple[str, ...]]] = field(
        default_factory=lambda: {"override": set(), "parked": set(), "waiting": set()}
    )

    def _owns_gauges(self) -> bool:
        """Whether this process sets the gauges: not a pool process forked since."""
        return os.getpid() == self.pid

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
        worker_shutdown.disconnect(self._on_worker_shutdown)
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
        dry_run, how = str(bool(kw.get("dry_run"))).lower(), str(kw.get("how") or "held")
        self.deferred.labels(funnel=funnel, dry_run=dry_run, how=how).inc()
        self.delay.labels(funnel=funnel).observe(delay)

    def _on_refused(
        self, sender: Any = None, funnel: str = "", error: Any = None, **_: Any
    ) -> None:
        self.failed.labels(funnel=funnel, reason=type(error).__name__).inc()

    def _on_collapsed(self, sender: Any = None, funnel: str = "", kind: str = "", **_: Any) -> None:
        self.collapsed.labels(funnel=funnel, kind=kind).inc()

    def _on_dropped(self, sender: Any = None, funnel: str = "", **_: Any) -> None:
        self.dropped.labels(funnel=funnel).inc()

    def _on_worker_shutdown(self, sender: Any = None, **_: Any) -> None:
        """The worker's main process ends: in multiprocess mode, its ``live*`` gauges
        (its held tasks above all) leave the shared directory with it."""
        if self._owns_gauges() and _multiprocess():
            mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    def _on_backend_error(self, sender: Any = None, **_: Any) -> None:
        self.backend_errors.inc()
        if self._owns_gauges():
            self.backend_up.set(0)

    def _on_backend_recovered(self, sender: Any = None, **_: Any) -> None:
        if self._owns_gauges():
            self.backend_up.set(1)

    def _on_live_refreshed(
        self,
        sender: Any = None,
        overrides: Any = None,
        parked: Any = None,
        queues: Callable[[], dict[tuple[str, str], int]] | None = None,
        **_: Any,
    ) -> None:
        if not self._owns_gauges():
            return
        now: dict[tuple[str, ...], float] = {}
        for name, entry in (overrides or {}).items():
            values = {
                "rate": None if entry.rate is None else entry.rate.per_second,
                "capacity": entry.capacity,
                "concurrency": entry.concurrency,
                "paused": 1 if entry.paused else None,
            }
            for part, value in values.items():
                if value is not None:
                    now[(name, part)] = value
        # an ended override leaves no series behind (multiprocess: NaN, paused 0)
        self._publish(
            "override", self.override, now, lambda key: 0 if key[1] == "paused" else math.nan
        )
        counts: dict[tuple[str, ...], float] = {
            (label,): count for label, count in (parked or {}).items()
        }
        self._publish("parked", self.parked, counts, lambda key: 0)  # nothing parked: 0
        if queues is not None:
            waiting: dict[tuple[str, ...], float] = {
                key: float(n) for key, n in queues().items() if n
            }
            self._publish("waiting", self.waiting, waiting, lambda key: 0)  # none: 0

    def _publish(
        self,
        name: str,
        gauge: Gauge,
        values: dict[tuple[str, ...], float],
        gone: Callable[[tuple[str, ...]], float],
    ) -> None:
        """Set ``gauge``'s series to ``values`` (label values -> value); a series set
        before and absent now is removed, or, in multiprocess mode (which cannot remove
        one), set to ``gone(label values)``."""
        seen = self._seen[name]
        if _multiprocess():
            for key in seen - set(values):
                gauge.labels(*key).set(gone(key))
        else:
            gauge.clear()
        for key, value in values.items():
            gauge.labels(*key).set(value)
        seen |= set(values)


_enabled: dict[int, Metrics] = {}


def _multiprocess() -> bool:
    """Whether prometheus_client runs in its multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``)."""
    return any(
        name in os.environ for name in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")
    )


def enable(registry: CollectorRegistry | None = None) -> Metrics:
    """Register celery-funnel's metrics in ``registry`` (default: the global one) and
    count every decision from now on, in this process and the pool processes it forks.
    Calling it again with the same registry returns the same ``Metrics``."""
    registry = REGISTRY if registry is None else registry
    if id(registry) in _enabled:
        return _enabled[id(registry)]
    prefix = "celery_funnel_"

    def counter(name: str, doc: str, *labels: str) -> Counter:
        return Counter(prefix + name, doc, list(labels), registry=registry)

    def gauge(
        name: str, doc: str, *labels: str,
        mode: Literal["livemostrecent", "liveall"] = "livemostrecent",
    ) -> Gauge:  # fmt: skip
        # set by the enabling process only: a pool process's zeros never show
        return Gauge(
            prefix + name, doc, list(labels), registry=registry, multiprocess_mode=mode,
        )  # fmt: skip

    metrics = Metrics(
        admitted=counter("admitted", "Tasks that passed their funnel", "funnel"),
        deferred=counter(
            "deferred",
            "Deferrals (not tasks: a task made to wait 3 times counts 3), by how it waits",
            *("funnel", "dry_run", "how"),
        ),
        failed=counter("failed", "Tasks the funnel failed", "funnel", "reason"),
        delay=Histogram(
            prefix + "deferral_delay_seconds",
            "Waits of deferred tasks, seconds",
            ["funnel"],
            buckets=DELAY_BUCKETS,
            registry=registry,
        ),
        backend_errors=counter("backend_errors", "Failed calls to the funnel's Redis"),
        backend_up=gauge(
            "backend_up", "0 while the funnel's Redis fails, else 1 (the worker's main process)"
        ),
        override=gauge(
            "override",
            "Runtime overrides in force (rate per second, capacity, concurrency, paused)",
            "funnel",
            "field",
        ),
        parked=gauge("parked", "Tasks parked in the funnels' Redis now", "funnel"),
        settled=counter(
            "settled_units",
            "Units given back (direction back) or charged on top (extra) by funnel_settle",
            *("funnel", "limit", "direction"),
        ),
        collapsed=counter(
            "collapsed",
            "Sends that published no task of their own (unique, debounce)",
            *("funnel", "kind"),
        ),
        dropped=counter(
            "dropped", "Unique tasks dropped by a worker (their key was held)", "funnel"
        ),
        waiting=gauge(
            "waiting",
            "Tasks waiting on a funnel now, per queue and how (held, republished: in this"
            " worker; parked: in the funnels' Redis, the same on every worker)",
            "queue",
            "how",
            mode="liveall",  # each worker's own count, summed by the query (module doc)
        ),
    )
    metrics.backend_up.set(1)
    for signal, receiver in metrics._receivers():
        signal.connect(receiver, weak=False)
    worker_shutdown.connect(metrics._on_worker_shutdown, weak=False)
    _enabled[id(registry)] = metrics
    return metrics
