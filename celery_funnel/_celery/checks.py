"""Mistakes caught before a task runs: at the ``@app.task`` call, and at worker start.

- ``install(app)`` wraps ``app.task`` so that each decorator call with ``funnel_*``
  options is checked as it is made (Celery creates the task class lazily, later);
  the error is raised from the decorator line.
- The worker-start check (the gate bootstep calls ``check_app``) reads every setting
  and every task after Celery applied ``task_annotations``: unknown ``funnel_*`` names,
  options on tasks that are not FunnelTasks, limits, keys, and a missing
  ``funnel_redis_url``.
- A worker (``celery worker`` or in-process) of an app that uses celery-funnel but
  never called ``install(app)`` stops at start (``worker_init``, see ``_install``).
- Where no task may be parked, a task with ``funnel_fair_by`` stops the worker at
  start (``check_fair``): fair share needs parking, and is never silently an ordinary
  funnel.
- A ``celery worker`` stopped by a mistake says it in one line (``refuse_start``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from celery import bootsteps
from celery.exceptions import WorkerTerminate

from .._config.options import (
    check_names,
    check_options,
    check_orphans,
    concurrency_of,
    limits_of,
    option_of,
    parameters,
)
from .._config.runtime import runtime_for
from .._config.settings import setting_name
from .._limiter.errors import ConfigurationError
from .._limiter.limit import Limit
from .._shared.charges import matching
from .._stores.persistence import Rule
from .task import FunnelTask

__all__ = [
    "NotInstalled", "check_app", "check_definitions", "check_fair", "refuse_start", "uses_funnel",
]  # fmt: skip

logger = logging.getLogger("celery_funnel")

_METHODS = tuple(name for name, value in vars(FunnelTask).items() if callable(value))


def _not_funnel_task(where: str, options: dict[str, Any]) -> ConfigurationError:
    given = ", ".join(f"{name}={value!r}" for name, value in options.items())
    return ConfigurationError(
        f"{where}: {given} given, but the task is not a FunnelTask, so it would run"
        f" unthrottled: add base=FunnelTask (from celery_funnel import FunnelTask)"
    )


def _check_decorator_call(app: Any, fun: Any, opts: dict[str, Any]) -> None:
    given = {name: value for name, value in opts.items() if name.startswith("funnel_")}
    name = opts.get("name") or app.gen_task_name(fun.__name__, fun.__module__)
    where = f"task {name!r}"
    check_names(where, given, _METHODS)
    base = opts.get("base") or app.Task
    if not (isinstance(base, type) and issubclass(base, FunnelTask)):
        raise _not_funnel_task(where, given)

    def get(option: str) -> Any:
        return opts[option] if option in opts else option_of(base, option)

    check_options(where, get, parameters(fun, bound=bool(opts.get("bind"))))


def _checked(app: Any, fun: Any, opts: dict[str, Any]) -> None:
    try:
        _check_decorator_call(app, fun, opts)
    except ConfigurationError as exc:
        # the traceback starts here, one frame under the user's decorator line
        raise exc.with_traceback(None) from None


def check_definitions(app: Any) -> None:
    """Wrap ``app.task`` so that ``funnel_*`` options are checked at the decorator call.

    Raises (from the decorator call):
        ConfigurationError: naming the task, the option and the value.
    """
    original: Callable[..., Any] = app.task

    @functools.wraps(original)
    def task(*args: Any, **opts: Any) -> Any:
        if not any(name.startswith("funnel_") for name in opts):
            return original(*args, **opts)
        if len(args) == 1 and callable(args[0]):
            _checked(app, args[0], opts)
            return original(*args, **opts)
        decorate = original(*args, **opts)

        @functools.wraps(decorate)
        def checked(fun: Any) -> Any:
            _checked(app, fun, opts)
            return decorate(fun)

        return checked

    app.task = task


def _defined_at(task: Any) -> str:
    """`` (defined at tasks.py:12)`` for the task's function, when known."""
    fun = getattr(task, "_decorated_fun", None) or inspect.getattr_static(task, "run", None)
    code = getattr(getattr(fun, "__func__", fun), "__code__", None)
    if code is None:
        return ""
    path = code.co_filename
    if os.path.isabs(path) and path.startswith(os.getcwd() + os.sep):
        path = os.path.relpath(path)
    return f" (defined at {path}:{code.co_firstlineno})"


def _funnel_names(task: Any) -> set[str]:
    names = {name for klass in type(task).__mro__ for name in vars(klass)}
    names.update(vars(task))
    return {name for name in names if name.startswith("funnel_")}


def _wildcard_names(app: Any) -> set[str]:
    """Options that ``task_annotations`` give every task (``"*"``): meant for the
    FunnelTasks among them, not an error on the others."""
    names: set[str] = set()
    for annotation in app.annotations:
        everyone = getattr(annotation, "annotate_any", None)
        names.update((everyone() if callable(everyone) else None) or ())
    return names


def _check_task(task: Any, wildcard: set[str]) -> bool:
    """Check one registered task; True when it has limits (and so needs Redis)."""
    where = f"task {task.name!r}{_defined_at(task)}"
    names = _funnel_names(task)
    if not isinstance(task, FunnelTask):
        given = {n: getattr(task, n) for n in sorted(names - wildcard)}
        if given:
            check_names(where, given)
            raise _not_funnel_task(where, given)
        return False
    check_names(where, {n: getattr(task, n) for n in sorted(names)}, _METHODS)
    get = partial(option_of, task)
    check_options(where, get, parameters(task.run, bound=False))
    check_orphans(where, get)
    return bool(limits_of(task)) or concurrency_of(task) is not None


def _names_apart(task: Any, worker_wide: Sequence[Limit]) -> None:
    """Refuse a limit name a task shares with a worker-wide limit that charges it
    (``funnel_settle(name=...)`` would not know which one it meant)."""
    own = {limit.name for limit in limits_of(task) if limit.name is not None}
    for limit in matching(worker_wide, task.name):
        if limit.name in own:
            raise ConfigurationError(
                f"task {task.name!r}: limit name {limit.name!r} is also the name of the"
                f" worker-wide funnel_limits[{limit.pattern!r}] that charges it; limit names"
                f" are unique per task"
            )


def _errors(app: Any) -> Iterable[str]:
    try:
        settings = runtime_for(app).settings
    except ConfigurationError as exc:
        settings = None
        yield str(exc)
    wildcard, throttled = _wildcard_names(app), []
    for task in list(app.tasks.values()):
        try:
            if _check_task(task, wildcard):
                throttled.append(task.name)
                if settings is not None:
                    _names_apart(task, settings.limits)
        except ConfigurationError as exc:
            yield str(exc)
    if settings is not None and (settings.limits or settings.concurrency or throttled):
        try:
            settings.require_redis()
        except ConfigurationError as exc:
            patterns = [lim.pattern for lim in settings.limits]
            patterns += [lim.pattern for lim in settings.concurrency]
            users = [*throttled, *(f"funnel_limits[{pattern!r}]" for pattern in patterns)]
            yield f"{exc}; it is needed by {', '.join(users)}"


def check_app(app: Any) -> None:
    """Check every ``funnel_*`` setting and every task of ``app`` (annotations applied):
    the worker-start check.

    Raises:
        ConfigurationError: naming each task or setting, option and value found wrong.
    """
    errors = list(_errors(app))
    if len(errors) == 1:
        raise ConfigurationError(errors[0])
    if errors:
        listed = "\n".join(f"  - {error}" for error in errors)
        raise ConfigurationError(f"{len(errors)} celery-funnel configuration errors:\n{listed}")


def check_fair(app: Any, park: bool | str, rule: Rule | None) -> None:
    """Fair share queues each tenant's waiting tasks parked in the funnels' Redis: where
    no task may be parked there (``funnel_park=False``, or ``rule`` refuses: no
    append-only file and not the broker's own Redis server), a task with
    ``funnel_fair_by`` stops the worker at start rather than run as an ordinary funnel.
    ``rule`` None (not known now: the funnels' Redis does not answer) lets it start.

    Raises:
        ConfigurationError: naming the first such task and why, in one line.
    """
    if park and rule is not Rule.NONE:
        return
    for task in list(app.tasks.values()):
        if isinstance(task, FunnelTask) and any(lim.fair_by is not None for lim in limits_of(task)):
            why = (
                "funnel_park=False"
                if not park
                else f"{Rule.NONE.value} (a restart would lose the parked tasks)"
            )
            raise ConfigurationError(
                f"task {task.name!r}: funnel_fair_by queues each tenant's waiting tasks"
                f" parked in the funnels' Redis, and none may be parked there: {why}; it would"
                f" act as an ordinary funnel: turn on 'appendonly yes' there, keep the"
                f" funnels on the broker's Redis, or drop funnel_fair_by"
            )


def refuse_start(consumer: Any, error: ConfigurationError) -> None:
    """Stop a worker at start for ``error``, found by a consumer bootstep.

    A worker run as a program (``celery worker``, ``app.worker_main()``) logs it once,
    at ERROR, as ``ConfigurationError: <message>`` (its traceback too under ``-l
    DEBUG``) and exits with status 1: raised, it would end in Celery's 70-line
    traceback of its own start-up code. Any other worker (``start_worker`` in tests)
    returns here, for the caller to raise ``error`` where it is caught and read.

    Raises:
        WorkerTerminate: status 1, in a worker run as a program.
    """
    from celery.apps.worker import Worker  # noqa: PLC0415 - what `celery worker` runs

    controller = getattr(consumer, "controller", None)
    if not isinstance(controller, Worker):
        return
    debug = getattr(controller, "loglevel", logging.INFO) <= logging.DEBUG
    logger.error("ConfigurationError: %s", error, exc_info=error if debug else None)
    raise WorkerTerminate(1) from None


def uses_funnel(app: Any) -> list[str]:
    """What in ``app`` uses celery-funnel: ``funnel_*`` settings, FunnelTasks, tasks
    with ``funnel_*`` options (empty when nothing does)."""
    found = [
        f"app.conf.{key}"
        for key in list(app.conf)
        if setting_name(key) is not None and app.conf[key] is not None
    ]
    wildcard = _wildcard_names(app)
    for task in list(app.tasks.values()):
        if isinstance(task, FunnelTask):
            found.append(f"FunnelTask {task.name!r}")
        elif _funnel_names(task) - wildcard:
            found.append(f"task {task.name!r} with funnel_* options")
    return found


class NotInstalled(bootsteps.Step):  # type: ignore[misc]
    """Consumer bootstep added to a worker whose app uses celery-funnel
    without ``install(app)``: it stops the worker at start (a ``worker_init``
    receiver cannot: Celery only logs what receivers raise)."""

    label = "celery-funnel not installed"

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        app = consumer.app
        found = uses_funnel(app)
        if found and not runtime_for(app).installed:
            error = ConfigurationError(
                f"app {app.main!r} uses celery-funnel ({', '.join(found[:5])}) but"
                f" install(app) was never called, so funnel_limits and the worker-start"
                f" checks are ignored: call celery_funnel.install(app) where the app is made"
            )
            refuse_start(consumer, error)
            raise error
