"""A FunnelTask's options: turned into limits, checked (where the task is defined, at the
call, at worker start), and the header the task carries between runs."""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import celery
from celery import Task

from .._limiter.concurrency import check_concurrency
from .._limiter.errors import ConfigurationError
from .._limiter.limit import Limit, parse_limit, unique_names
from .._limiter.strategies import capabilities
from .._limiter.values import check_fields, did_you_mean, to_bool
from .dedupe import Debounce, Unique, check_dedupe
from .outage import check_policy

_said: set[tuple[int, str, str, str]] = set()  # rate_limit warnings given

OPTIONS = (
    "funnel_rate",
    "funnel_capacity",
    "funnel_strategy",
    "funnel_key",
    "funnel_cost",
    "funnel_limits",
    "funnel_on_backend_error",
    "funnel_dry_run",
    "funnel_fair_by",
    "funnel_weights",
    "funnel_concurrency",
    "funnel_max_waiting",
    "funnel_unique",
    "funnel_unique_ttl",
    "funnel_debounce",
    "funnel_debounce_max",
    "funnel_adaptive",
)
# funnel_<field> options
_FIELDS = ("rate", "capacity", "strategy", "key", "cost", "fair_by", "weights", "adaptive")
_DEFAULTS = {  # FunnelTask's
    "capacity": 1, "strategy": "gcra", "key": None, "cost": 1, "fair_by": None, "weights": None,
    "adaptive": None,
}  # fmt: skip
_ABSTRACT_RUN = Task.__dict__["run"]


Getter = Callable[[str], Any]  # an option's value by name (None when unset)


def option_of(task: Any, name: str) -> Any:
    """The task's (or task class's) option ``name``, None when unset."""
    # Read without binding: a function stored as a class attribute (funnel_key=lambda
    # ...) would otherwise come back as a method of the task.
    value = inspect.getattr_static(task, name, None)
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def task_name(task: Any) -> str:
    """The task's name, as messages show it."""
    return str(getattr(task, "name", None) or getattr(task, "__name__", task))


def _read_once(task: Any, name: str, read: Callable[[], Any]) -> Any:
    """``read()``, kept on a task object after its first call: the gate asks for the
    same options for every task it decides (``getattr_static`` costs microseconds)."""
    if isinstance(task, type):
        return read()
    cache: dict[str, Any] = task.__dict__.setdefault("_funnel_option_cache", {})
    if name not in cache:
        cache[name] = read()
    return cache[name]


def policy_of(task: Any, default: str) -> str:
    """The task's ``funnel_on_backend_error``, else the setting's ``default``."""

    def read() -> str | None:
        value = option_of(task, "funnel_on_backend_error")
        if value is None:
            return None
        return check_policy(f"task {task_name(task)!r}: funnel_on_backend_error", value)

    own: str | None = _read_once(task, "funnel_on_backend_error", read)
    return default if own is None else own


def dry_run_of(task: Any, default: bool) -> bool:
    """The task's ``funnel_dry_run``, else the setting's ``default``.

    Raises:
        ConfigurationError: when it is not a boolean (``"false"`` is False, not True).
    """

    def read() -> bool | None:
        value = option_of(task, "funnel_dry_run")
        return (
            None if value is None else to_bool(f"task {task_name(task)!r}: funnel_dry_run", value)
        )

    own: bool | None = _read_once(task, "funnel_dry_run", read)
    return default if own is None else own


def limits_from(where: str, get: Getter) -> tuple[Limit, ...]:
    """The limits that options read by ``get`` describe: the one ``funnel_rate`` and
    friends describe, then each of ``funnel_limits``.

    Raises:
        ConfigurationError: naming ``where``, the option and the value.
    """
    limits: list[Limit] = []
    if get("funnel_rate") is not None:
        spec = {field: get(f"funnel_{field}") for field in _FIELDS}
        spec["capacity"] = whole(spec["capacity"])
        limits.append(parse_limit(spec, where=where, label="funnel_{}".format))
    more = get("funnel_limits") or ()
    if not isinstance(more, (list, tuple)):
        raise ConfigurationError(f"{where}: funnel_limits must be a list of limits, got {more!r}")
    for i, spec in enumerate(more):
        if isinstance(spec, Mapping) and "concurrency" in spec:
            raise ConfigurationError(
                f"{where}: funnel_limits[{i}] has 'concurrency': a task's own concurrency"
                f" limit is funnel_concurrency=N (per key with funnel_key)"
            )
        limits.append(parse_limit(spec, where=where, label=f"funnel_limits[{i}]['{{}}']".format))
    own = int(get("funnel_rate") is not None)  # funnel_rate's limit comes first
    unique_names(limits, where, lambda i: f"funnel_limits[{i - own}]['name']")
    if len(limits) > 1 and not all(capabilities(limit.strategy).joint for limit in limits):
        raise ConfigurationError(f"{where}: several limits on one task need the 'gcra' strategy")
    if sum(limit.fair_by is not None for limit in limits) > 1:
        raise ConfigurationError(
            f"{where}: fair_by is set on several limits; one funnel per task is shared"
            f" fairly (set funnel_fair_by, or 'fair_by' on one entry of funnel_limits)"
        )
    return tuple(limits)


def whole(value: Any) -> Any:
    """A whole-number option's value: a string of digits (``"3"``, as Celery's own
    options take strings) as the int it reads as; anything else as given, for the
    option's check to accept or refuse."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    return value


def _checked(task: Any, name: str, check: Callable[[str, Any], int]) -> int | None:
    """The task's option ``name`` through ``check`` (None when unset)."""
    value = option_of(task, name)
    return None if value is None else check(f"task {task_name(task)!r}: {name}", whole(value))


def concurrency_of(task: Any) -> int | None:
    """The task's ``funnel_concurrency`` (None when unset).

    Raises:
        ConfigurationError: naming the task and the value.
    """
    return _checked(task, "funnel_concurrency", check_concurrency)


def max_waiting_of(task: Any) -> int | None:
    """The task's ``funnel_max_waiting`` (None when unset).

    Raises:
        ConfigurationError: naming the task and the value.
    """
    return _checked(task, "funnel_max_waiting", check_max_waiting)


def _dedupe_of(task: Any) -> tuple[Unique | None, Debounce | None]:
    """The task's unique and debounce options, read once (on every send)."""

    def read() -> tuple[Unique | None, Debounce | None]:
        return check_dedupe(f"task {task_name(task)!r}", partial(option_of, task))

    found: tuple[Unique | None, Debounce | None] = _read_once(task, "funnel_dedupe", read)
    return found


def unique_of(task: Any) -> Unique | None:
    """The task's ``funnel_unique`` (None when off).

    Raises:
        ConfigurationError: naming the task, the option and the value.
    """
    return _dedupe_of(task)[0]


def debounce_of(task: Any) -> Debounce | None:
    """The task's ``funnel_debounce`` (None when off).

    Raises:
        ConfigurationError: naming the task, the option and the value.
    """
    return _dedupe_of(task)[1]


def _keyed(get: Getter) -> bool:
    """Whether an option other than a rate splits by ``funnel_key``."""
    return any(
        get(name) is not None
        for name in ("funnel_concurrency", "funnel_max_waiting", "funnel_unique", "funnel_debounce")
    )


def check_max_waiting(where: str, value: Any) -> int:
    """A ``funnel_max_waiting`` value: a whole number from 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{where} must be a whole number from 1, got {value!r}")
    return value


def limits_of(task: Any) -> tuple[Limit, ...]:
    """The task's limits from its ``funnel_*`` options (``task_annotations`` included).

    Raises:
        ConfigurationError: naming the task, the option and the value.
    """
    limits = limits_from(f"task {task_name(task)!r}", partial(option_of, task))
    policy_of(task, "defer")
    return limits


def check_names(where: str, given: Mapping[str, Any], allowed: Iterable[str] = ()) -> None:
    """Refuse ``funnel_*`` names of ``given`` (name -> value) that are no FunnelTask
    option (misspellings would be ignored), suggesting the option meant.

    Raises:
        ConfigurationError: naming ``where``, the name and its value.
    """
    known = {*OPTIONS, *allowed}
    for name, value in given.items():
        if name.startswith("funnel_") and name not in known:
            raise ConfigurationError(
                f"{where}: {name}={value!r} is not a FunnelTask option"
                f"{did_you_mean(name, OPTIONS)}; the options are {list(OPTIONS)}"
            )


def parameters(run: Any, *, bound: bool) -> list[str] | None:
    """The names of ``run``'s parameters (without ``self`` when ``bound``), or None
    when they cannot be known (no signature, or Celery's abstract ``Task.run``)."""
    if isinstance(run, staticmethod):
        run, bound = run.__func__, False
    if run is None or getattr(run, "__func__", run) is _ABSTRACT_RUN:
        return None
    try:
        names = list(inspect.signature(run).parameters)
    except (TypeError, ValueError):
        return None
    return names[1:] if bound else names


def check_keys(where: str, get: Getter, params: list[str] | None) -> None:
    """Refuse a format-string key (``funnel_key``, or ``key`` in ``funnel_limits``)
    whose fields are not parameters of the task: every run would fail with a bare
    ``KeyError``.

    Raises:
        ConfigurationError: naming the option, the key, the field and the parameters.
    """
    if params is None:
        return
    keys: list[tuple[str, Any]] = []
    if get("funnel_rate") is not None:
        keys = [("funnel_key", get("funnel_key")), ("funnel_fair_by", get("funnel_fair_by"))]
    elif _keyed(get):
        keys = [("funnel_key", get("funnel_key"))]
    for i, spec in enumerate(get("funnel_limits") or ()):
        if isinstance(spec, Mapping):
            keys.append((f"funnel_limits[{i}]['key']", spec.get("key")))
            keys.append((f"funnel_limits[{i}]['fair_by']", spec.get("fair_by")))
    for option, key in keys:
        check_fields(f"{where}: {option}", key, params, "the task")


def check_options(where: str, get: Getter, params: list[str] | None) -> None:
    """The checks of a task's options that need no app: limits, keys against
    ``params`` (its parameters), booleans and choices.

    Raises:
        ConfigurationError: naming ``where``, the option and the value.
    """
    limits_from(where, get)
    check_rate_limit(where, get)
    if get("funnel_concurrency") is not None:
        check_concurrency(f"{where}: funnel_concurrency", whole(get("funnel_concurrency")))
    if get("funnel_max_waiting") is not None:
        check_max_waiting(f"{where}: funnel_max_waiting", whole(get("funnel_max_waiting")))
    check_dedupe(where, get)
    check_keys(where, get, params)
    if get("funnel_dry_run") is not None:
        to_bool(f"{where}: funnel_dry_run", get("funnel_dry_run"))
    if get("funnel_on_backend_error") is not None:
        check_policy(f"{where}: funnel_on_backend_error", get("funnel_on_backend_error"))


def check_rate_limit(where: str, get: Getter) -> None:
    """Warn (a log line, once per definition) about Celery's ``rate_limit`` on a task
    with ``funnel_rate``: both apply (Celery's per worker, the funnel's over every
    worker), the stricter one winning, which is seldom what a move to ``funnel_rate``
    meant; a per-worker cap beside a shared one stays possible. A ``rate_limit`` every
    task has from ``task_default_rate_limit`` is left to Celery."""
    rate_limit, funnel_rate = get("rate_limit"), get("funnel_rate")
    if rate_limit is None or funnel_rate is None:
        return
    app = get("_app")
    if app is not None and rate_limit == app.conf.get("task_default_rate_limit"):
        return  # the app's default for every task, not this task's own
    said = (id(app), where, str(rate_limit), str(funnel_rate))
    if said in _said:  # a task's options are checked more than once per definition
        return
    _said.add(said)
    # a Python warning: shown where no logging is set up (an import, a shell, a test),
    # and in a worker's log (Celery routes warnings to logging there)
    warnings.warn(
        f"celery-funnel: {where}: rate_limit={rate_limit!r} and funnel_rate={funnel_rate!r}"
        f" both apply (rate_limit per worker, funnel_rate over every worker); remove"
        f" rate_limit unless a per-worker cap is meant (docs/configuration.md, 'Moving off"
        f" rate_limit')",
        UserWarning, stacklevel=_caller_level(),
    )  # fmt: skip


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside celery-funnel and Celery (the
    user's ``@app.task`` line, or the worker's start)."""
    ours = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(celery.__file__))
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(ours):
        frame, level = frame.f_back, level + 1
    return level


def check_orphans(where: str, get: Getter) -> None:
    """Refuse options of the task's own limit given without ``funnel_rate``: they would
    be ignored. (At worker start only: ``task_annotations`` may give the rate.)

    Raises:
        ConfigurationError: naming the task, the option and the value.
    """
    if get("funnel_rate") is not None:
        return
    for field, default in _DEFAULTS.items():
        if field == "key" and _keyed(get):
            continue  # it splits the concurrency limit, the backlog, unique or debounce
        value = get(f"funnel_{field}")
        if value is not None and value != default:
            raise ConfigurationError(
                f"{where}: funnel_{field}={value!r} has no effect without funnel_rate: set"
                f" funnel_rate, or give it to an entry of funnel_limits"
            )


def check_call(task: Any, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> None:
    """At the call (``apply_async``/``delay``): refuse argument values that would make
    an unstable funnel key (see ``check_plain``). Callable keys are checked when the
    task runs, as calling them here could have effects.

    Raises:
        ConfigurationError: naming the task, the key field and the value.
    """
    keyed = task.__dict__.get("_funnel_call_keys")
    if keyed is None:
        keyed = task.__dict__["_funnel_call_keys"] = tuple(
            limit for limit in limits_of(task) if isinstance(limit.key, str)
        )
    if not keyed:
        return
    args, kwargs = args or (), kwargs or {}
    for limit in keyed:
        try:
            limit.key_part(task.run, args, kwargs)
        except ConfigurationError as exc:
            raise ConfigurationError(f"task {task_name(task)!r}: {exc}") from None
        except (TypeError, LookupError, AttributeError):
            return  # arguments that do not fit: Celery's own check, or the run, says so


def check_class(cls: type, base: type) -> None:
    """The definition-time check of a FunnelTask class (``base`` is FunnelTask): its own
    ``funnel_*`` names (methods of ``base`` aside), limits, and keys against its
    ``run``'s parameters.

    Raises:
        ConfigurationError: naming the task, the option and the value.
    """
    own = {name: value for name, value in vars(cls).items() if name.startswith("funnel_")}
    if not own and "run" not in vars(cls):
        return
    methods = [name for name, value in vars(base).items() if callable(value)]
    where = f"task {task_name(cls)!r}"
    check_names(where, own, methods)
    run = inspect.getattr_static(cls, "run", None)  # a staticmethod unless bind=True
    check_options(where, partial(option_of, cls), parameters(run, bound=True))
