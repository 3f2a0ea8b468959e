"""A FunnelTask's options turned into limits, and the header it carries between runs."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

from ._errors import ConfigurationError
from ._limit import Limit, parse_limit
from ._settings import check_policy

HEADER = "celery_funnel"
OPTIONS = (
    "funnel_rate",
    "funnel_capacity",
    "funnel_strategy",
    "funnel_key",
    "funnel_cost",
    "funnel_limits",
    "funnel_on_backend_error",
    "funnel_dry_run",
)


class Deferral(NamedTuple):
    """What the header carries from one run of a task to the next."""

    deferrals: int = 0  # times deferred so far
    booked: bool = False  # a slot is booked under the task id
    stale: int = 0  # times its ticket came too late (the late grace doubles each time)
    outages: int = 0  # deferrals in a row because the funnel's Redis failed

    @classmethod
    def from_headers(cls, headers: Mapping[str, Any] | None) -> Deferral:
        raw = (headers or {}).get(HEADER) or {}
        return cls(
            int(raw.get("deferrals", 0)),
            bool(raw.get("booked")),
            int(raw.get("stale", 0)),
            int(raw.get("outages", 0)),
        )

    def header(self) -> dict[str, Any]:
        return self._asdict()


def _option(task: Any, name: str) -> Any:
    # Read without binding: a function stored as a class attribute (funnel_key=lambda
    # ...) would otherwise come back as a method of the task.
    value = inspect.getattr_static(task, name, None)
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def policy_of(task: Any, default: str) -> str:
    """The task's ``funnel_on_backend_error``, else the setting's ``default``."""
    value = _option(task, "funnel_on_backend_error")
    if value is None:
        return default
    name = getattr(task, "name", None) or getattr(task, "__name__", task)
    return check_policy(f"task {name!r}: funnel_on_backend_error", value)


def dry_run_of(task: Any, default: bool) -> bool:
    """The task's ``funnel_dry_run``, else the setting's ``default``."""
    value = _option(task, "funnel_dry_run")
    return default if value is None else bool(value)


def limits_of(task: Any) -> tuple[Limit, ...]:
    """The task's limits from its ``funnel_*`` options (``task_annotations`` included):
    the one ``funnel_rate`` and friends describe, then each of ``funnel_limits``.

    Raises:
        ConfigurationError: naming the task, the option and the value.
    """
    name = getattr(task, "name", None) or getattr(task, "__name__", task)
    where = f"task {name!r}"
    specs: list[Any] = []
    if _option(task, "funnel_rate") is not None:
        specs.append({
            "rate": _option(task, "funnel_rate"),
            "capacity": _option(task, "funnel_capacity"),
            "strategy": _option(task, "funnel_strategy"),
            "key": _option(task, "funnel_key"),
            "cost": _option(task, "funnel_cost"),
        })  # fmt: skip
    more = _option(task, "funnel_limits") or ()
    if not isinstance(more, (list, tuple)):
        raise ConfigurationError(f"{where}: funnel_limits must be a list of limits, got {more!r}")
    specs.extend(more)
    try:
        limits = tuple(parse_limit(spec, where=where) for spec in specs)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} (funnel_* options of the task)") from None
    if len(limits) > 1 and any(limit.strategy != "gcra" for limit in limits):
        raise ConfigurationError(f"{where}: several limits on one task need the 'gcra' strategy")
    policy_of(task, "defer")
    return limits
