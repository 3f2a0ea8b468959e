"""The worker gate's bootstep (``FunnelGate``): it checks the settings and every
FunnelTask at worker start and puts the worker gate (``_gate.gate.WorkerGate``) in
front of ``consumer.on_task_request``, the one point every due task passes."""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from .._config.options import concurrency_of, debounce_of, option_of, unique_of
from .._config.runtime import runtime_for
from .._gate.gate import WorkerGate
from .._limiter.errors import ConfigurationError
from .._stores.persistence import aof_everywhere
from .checks import check_app, refuse_start
from .received import ReceivedOnce
from .task import FunnelTask, limits_of
from .unique import Front

__all__ = ["FunnelGate", "WorkerGate"]

logger = logging.getLogger("celery_funnel")


def _is_funnel_task(task: Any) -> bool:
    return isinstance(task, FunnelTask)


def check_tasks(app: Any) -> None:
    """Check every setting and task of ``app`` (``_checks.check_app``), so that bad
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
        runtime_for(consumer.app).close()

    def stop(self, consumer: Any) -> None:
        gate = consumer.on_task_request
        if isinstance(gate, WorkerGate):
            gate.drop_held()

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
                ``funnel_park=True`` on a Redis without AOF.
        """
        check_tasks(consumer.app)
        runtime = runtime_for(consumer.app)
        settings = runtime.settings
        if settings.limits:
            settings.require_redis()
        if settings.limits or settings.concurrency or _funnel_tasks(consumer.app):
            gate = WorkerGate(runtime, consumer, consumer.on_task_request, _is_funnel_task)
            if _uses(consumer.app, "funnel_unique"):  # others pay nothing for it
                gate.handle = Front(runtime, consumer.app, gate.handle, gate.events)
            gate.parking.start()  # funnel_park=True on a Redis without AOF stops here
            _check_debounce(runtime, consumer.app)
            consumer.on_task_request = gate
            ReceivedOnce(consumer)  # a task the gate published again is received once


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


def _uses(app: Any, option: str) -> bool:
    """Whether a FunnelTask of ``app`` sets ``option``."""
    return any(
        isinstance(t, FunnelTask) and option_of(t, option) is not None
        for t in list(app.tasks.values())
    )


def _aof(runtime: Any) -> bool:
    """Whether the funnels' Redis has AOF on; True when it cannot say now (down at
    worker start: parking's own check logs it, and waits for it)."""
    try:
        return aof_everywhere(runtime.funnel.client)
    except Exception as error:
        logger.warning("celery-funnel: cannot read the funnels' Redis persistence (%r):"
                       " debounced sends need an append-only file there", error)  # fmt: skip
        return True


def _check_debounce(runtime: Any, app: Any) -> None:
    """Debounced sends wait only in the funnels' Redis: refuse to start where they would
    not be released (``funnel_park=False``: no releaser) or could be lost (no AOF).

    Raises:
        ConfigurationError: naming the task, its ``funnel_debounce`` and the reason.
    """
    for task in list(app.tasks.values()):
        spec = debounce_of(task) if isinstance(task, FunnelTask) else None
        if spec is None:
            continue
        where = f"task {task.name!r}: funnel_debounce={spec.seconds:g}"
        if not runtime.settings.park:
            raise ConfigurationError(
                f"{where} needs funnel_park (the workers' releasers publish debounced runs);"
                f" funnel_park=False"
            )
        if not _aof(runtime):
            raise ConfigurationError(
                f"{where} keeps each key's last send in the funnels' Redis, which has no"
                f" append-only file (a restart would lose them): turn on 'appendonly yes'"
            )
