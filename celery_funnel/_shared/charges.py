"""Which funnels one run of a task pays: its own (``FunnelTask`` options) and every
matching worker-wide ``funnel_limits`` entry; for ``celery.map``/``celery.starmap``
(``chunks``, ``task.map``, ``task.starmap``), those of the inner task, once per item.

A map runs its items as direct calls inside one outer task, where no gate can see them,
so the outer task pays for all of them before it starts: on each funnel, the sum of its
items' costs. A sum above the funnel's capacity would never fit, so for the map the
capacity is raised to the sum: the map starts once the funnel could take the whole batch
(an idle funnel at the latest), and the tasks after it wait until the batch has drained
at the funnel's rate.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .._config.runtime import Runtime
from .._limiter.fair import Fair
from .._limiter.limit import Limit, fixed

__all__ = ["MAPS", "Charge", "Charges", "label_of", "labels_of", "matching"]

MAPS = ("celery.map", "celery.starmap")
_UNSEEN: Any = object()  # a task type whose own charges were not looked up yet


@dataclass(frozen=True)
class Charge:
    """One funnel a run of a task pays: ``cost`` units of ``limit`` on ``key``;
    ``label`` names it in signals and logs (the task name, or ``limit:<pattern>``)."""

    limit: Limit
    key: str
    cost: int
    label: str
    fair: Fair | None = None  # its tenant, on a fair-share funnel (_limiter.fair)


def label_of(charges: Sequence[Charge]) -> str:
    """The funnels' names, joined: what a deferral by all of them reports."""
    if len(charges) == 1:  # most runs: one funnel
        return charges[0].label
    return "+".join(labels_of(charges))


def labels_of(charges: Sequence[Charge]) -> Sequence[str]:
    """Each funnel's name, once, in order."""
    if len(charges) == 1:
        return (charges[0].label,)
    return tuple(dict.fromkeys(charge.label for charge in charges))


class _Patterned(Protocol):
    @property
    def pattern(self) -> str | None: ...


P = TypeVar("P", bound=_Patterned)


def matching(entries: Iterable[P], name: str) -> tuple[P, ...]:
    """The worker-wide entries (``funnel_limits``: rates, concurrency) whose pattern
    matches task ``name``."""
    return tuple(
        e for e in entries if e.pattern is not None and fnmatch.fnmatchcase(name, e.pattern)
    )


OwnCharges = Callable[[Runtime, Sequence[Any], Mapping[str, Any]], Iterable[Charge]]
"""What one run of a task pays on its own funnels (its ``funnel_*`` options)."""
OwnOf = Callable[[Any], "OwnCharges | None"]
"""A registered task's own charges (None: it has none): ``_celery.task.own_charges``."""


class Charges:
    """Builds the charges of task requests for one app in one worker (``hostname``:
    the node name, for ``"scope": "worker"`` limits; ``own_of(task)``: a task's own
    charges)."""

    def __init__(self, runtime: Runtime, app: Any, hostname: str, own_of: OwnOf) -> None:
        self.runtime, self.app, self.hostname, self.own_of = runtime, app, hostname, own_of
        self._own: dict[str, OwnCharges | None] = {}  # per task type, once registered
        self._by_name: dict[str, tuple[Limit, ...]] = {}
        self._fixed: dict[str, tuple[Charge, ...]] = {}  # per task name, when all fixed

    def worker_limits(self, name: str) -> tuple[Limit, ...]:
        """Every worker-wide limit whose pattern matches task ``name``."""
        if name not in self._by_name:
            self._by_name[name] = matching(self.runtime.settings.limits, name)
        return self._by_name[name]

    def key(self, limit: Limit) -> str:
        """The funnel key of a worker-wide limit."""
        return self.runtime.limit_key(
            limit.pattern, self.hostname if limit.scope == "worker" else ""
        )

    def of(
        self, type_: str, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> list[Charge]:
        """The charges of one run of task ``type_`` (registered name) sent as ``name``
        (its shadow name, if any) with ``args`` and ``kwargs``.

        Raises:
            Exception: what a ``funnel_key`` or ``funnel_cost`` callable raises, and
                ``ConfigurationError`` for a bad cost or setting.
        """
        if type_ in MAPS:
            return self._of_map(type_, args, kwargs)
        charges: list[Charge] = []
        own = self._own.get(type_, _UNSEEN)
        if own is _UNSEEN:
            task = self.app.tasks.get(type_)
            own = self.own_of(task)
            if task is not None:
                self._own[type_] = own
        if own is not None:
            charges.extend(own(self.runtime, args, kwargs))
        charges.extend(self._worker_charges(name, args, kwargs))
        return charges

    def _worker_charges(
        self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[Charge, ...]:
        known = self._fixed.get(name)
        if known is not None:
            return known
        limits = self.worker_limits(name)
        charges = tuple(
            Charge(limit, self.key(limit), limit.cost_of(args, kwargs), f"limit:{limit.pattern}")
            for limit in limits
        )
        if all(fixed(limit) for limit in limits):
            self._fixed[name] = charges
        return charges

    def _of_map(self, type_: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Charge]:
        bound = dict(zip(("task", "it"), args, strict=False)) | dict(kwargs)
        inner, items = bound.get("task"), bound.get("it") or ()
        if not isinstance(inner, Mapping) or "task" not in inner:
            return []
        name = str(inner["task"])
        totals: dict[str, Charge] = {}
        for item in items:
            item_args = tuple(item) if type_ == "celery.starmap" else (item,)
            for charge in self.of(name, name, item_args, {}):
                seen = totals.get(charge.key)
                cost = charge.cost + (seen.cost if seen else 0)
                totals[charge.key] = dataclasses.replace(charge, cost=cost)
        return [
            dataclasses.replace(
                c, limit=dataclasses.replace(c.limit, capacity=max(c.limit.capacity, c.cost))
            )
            for c in totals.values()
        ]
