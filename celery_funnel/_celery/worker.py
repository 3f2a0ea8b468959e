"""The worker's bootsteps: ``FunnelGate`` checks the settings and every FunnelTask at
worker start and puts the worker gate (``_gate.gate.WorkerGate``) in front of
``consumer.on_task_request``, the one point every due task passes; ``ReleaserStep``
(which requires it) runs the releaser. What each runs is composed by
``_celery.services``, in this order."""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from .._config.options import concurrency_of, debounce_of, unique_of
from .._config.runtime import Runtime, runtime_for
from .._gate.gate import WorkerGate
from .._limiter.errors import ConfigurationError
from .._shared.publish import close_producers
from .._stores.persistence import Rule
from . import debounce, services
from .checks import check_app, check_fair, refuse_start
from .loop import LoopStep
from .received import ReceivedOnce
from .releaser import Releaser, announce_revoked
from .task import FunnelTask, limits_of
from .teardown import CloseBeforeCollect, LostConnection
from .unique import Front

__all__ = ["FunnelGate", "ReleaserStep", "WorkerGate"]

logger = logging.getLogger("celery_funnel")


def check_tasks(app: Any) -> None:
    """Check every setting and task of ``app`` (``_celery.checks.check_app``), so that bad
    options fail at worker start, named."""
    check_app(app)


class FunnelGate(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: checks the settings and every FunnelTask's options (a bad
    value stops the worker at start, named), and installs the worker gate when
    ``funnel_limits`` is set or a FunnelTask is registered; drops the requests the gate
    holds when the broker connection closes (``stop``, as the consumer restarts)."""

    label = "celery-funnel gate"

    def shutdown(self, consumer: Any) -> None:
        gate = consumer.on_task_request
        if isinstance(gate, WorkerGate):
            gate.close()
            if isinstance(gate.handle, Front):
                gate.handle.close()
        close_producers(consumer.app)
        runtime_for(consumer.app).close()

    def stop(self, consumer: Any) -> None:
        gate = consumer.on_task_request
        if isinstance(gate, WorkerGate):
            gate.drop_held()
            # the broker's connection is made again next: either Redis may have
            # restarted, so whether tasks may be parked is read again then
            runtime_for(consumer.app).persistence.stale()

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        try:
            self._install_gate(consumer)
        except ConfigurationError as error:
            refuse_start(consumer, error)
            raise
        settings = runtime_for(consumer.app).settings
        if settings.limits:
            logger.info(
                "celery-funnel: worker-wide limits on %s",
                ", ".join(f"{limit.pattern}={limit.rate}" for limit in settings.limits),
            )
        if settings.redis_url:  # one log line per problem of the funnels' Redis
            runtime_for(consumer.app).check_backend()

    @staticmethod
    def _install_gate(consumer: Any) -> None:
        """Check the app, then put the gate in front of ``on_task_request`` where a
        funnel applies.

        Raises:
            ConfigurationError: a mistake in the settings or a task's options, or
                ``funnel_park=True`` where parking would be less safe than the broker.
        """
        check_tasks(consumer.app)
        runtime = runtime_for(consumer.app)
        settings = runtime.settings
        if settings.limits:
            settings.require_redis()
        if settings.limits or settings.concurrency or _funnel_tasks(consumer.app):
            gate = services.gate(runtime, consumer)
            gate.parking.start()  # funnel_park=True where the rule refuses stops here
            # the rule parking's start read just now (None: not known, allowed)
            rule = runtime.persistence.rule() if settings.redis_url else None
            _check_debounce(runtime, consumer.app, rule)
            check_fair(consumer.app, settings.park, rule)
            consumer.on_task_request = gate
            ReceivedOnce(consumer)  # a task the gate published again is received once
            CloseBeforeCollect(consumer)  # holding tasks, it outlives a broker restart
            LostConnection(consumer, gate.connection_lost)  # the runs it cut off run once


def _funnel_tasks(app: Any) -> bool:
    """Whether ``app`` has a FunnelTask with a funnel (the gate decides its runs), or a
    unique or debounced one (the gate takes their keys, accepts their releases)."""
    return any(
        isinstance(t, FunnelTask)
        and (
            limits_of(t)
            or concurrency_of(t) is not None
            or unique_of(t) is not None
            or debounce_of(t) is not None
        )
        for t in list(app.tasks.values())
    )


def _check_debounce(runtime: Runtime, app: Any, rule: Rule | None) -> None:
    """Debounced sends wait only in the funnels' Redis: refuse to start where they would
    not be released (``funnel_park=False``: no releaser) or could be lost (``rule``: no
    AOF, and not the broker's own Redis server; None: not known now, allowed).

    Raises:
        ConfigurationError: naming the task, its ``funnel_debounce`` and the reason.
    """
    for task in list(app.tasks.values()):
        spec = debounce_of(task) if isinstance(task, FunnelTask) else None
        if spec is None:
            continue
        if rule is None and runtime.settings.park:
            logger.warning(
                "celery-funnel: cannot read the funnels' Redis persistence: debounced sends"
                " need an append-only file there, or the broker's own Redis server"
            )
        debounce.check_store(runtime, task, spec, rule=rule)


class ReleaserStep(LoopStep):
    """Consumer bootstep: runs a ``Releaser`` while the consumer runs (parking on);
    after ``FunnelGate`` (``LoopStep.requires``)."""

    label = "celery-funnel releaser"

    def make(self, consumer: Any) -> Releaser | None:
        return services.releaser(consumer, lambda i: announce_revoked(consumer, i))
