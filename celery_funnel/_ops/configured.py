"""The app's configured funnels, idle ones too, for ``celery funnel status`` and
``inspect``: every FunnelTask's limits and concurrency, every ``funnel_limits`` entry,
each with the limit in force (a live override included), whether or not Redis holds a
key of it yet (a funnel's key appears with its first task and expires when idle)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from .._celery.task import FunnelTask
from .._config.options import concurrency_of, limits_of
from .._config.runtime import Runtime
from .._limiter import strategies
from .._limiter.concurrency import ConcurrencyLimit
from .._limiter.keys import FunnelKey
from .._limiter.limit import Limit
from .._shared.overrides import Override
from .control import LIMIT_PREFIX
from .view import Found, concurrency_funnels

__all__ = [
    "Configured", "concurrency_in_force", "configured", "idle_rows", "in_force", "parked_of",
]  # fmt: skip

PER_KEY = "one funnel per funnel_key value"
PER_WORKER = "one funnel per worker"


class Configured(NamedTuple):
    """One funnel of the app's code: its ``name`` (as overrides name it: a task name or
    ``limit:<pattern>``), its ``key`` (per ``funnel_key`` value, the keys are this one's
    parts), a rate ``limit`` or a ``concurrency`` N, and ``owns(key)``: whether a key
    found in Redis is one of it."""

    name: str
    key: str
    limit: Limit | None
    concurrency: int | None
    owns: Callable[[FunnelKey], bool]
    parts: str = ""  # how it splits: "" (one funnel), PER_KEY or PER_WORKER


def _of_task(task_name: str, index: int | None) -> Callable[[FunnelKey], bool]:
    return lambda key: key.of_task(task_name, index)


def _of_limit(pattern: str | None) -> Callable[[FunnelKey], bool]:
    return lambda key: key.of_limit(pattern)


def configured(runtime: Runtime) -> Iterator[Configured]:
    """Every funnel the app's code configures: FunnelTasks by name (their rate limits,
    then their concurrency), then the worker-wide limits."""
    tasks = [t for t in list(runtime.app.tasks.values()) if isinstance(t, FunnelTask)]
    for task in sorted(tasks, key=lambda t: str(t.name)):
        limits = limits_of(task)
        for i, limit in enumerate(limits):
            index = None if len(limits) == 1 else i
            key = runtime.task_key(task.name, "", index)
            parts = PER_KEY if limit.key is not None else ""
            yield Configured(task.name, key, limit, None, _of_task(task.name, index), parts)
        n = concurrency_of(task)
        if n is not None:
            parts = PER_KEY if task.funnel_key is not None else ""
            key = runtime.task_key(task.name)
            yield Configured(task.name, key, None, n, _of_task(task.name, None), parts)
    worker_wide: list[tuple[Limit | ConcurrencyLimit, Limit | None, int | None]]
    worker_wide = [(x, x, None) for x in runtime.settings.limits]
    worker_wide += [(x, None, x.n) for x in runtime.settings.concurrency]
    for entry, rate, n in worker_wide:
        name, key = f"{LIMIT_PREFIX}{entry.pattern}", runtime.limit_key(entry.pattern)
        parts = PER_WORKER if entry.scope == "worker" else ""
        yield Configured(name, key, rate, n, _of_limit(entry.pattern), parts)


def in_force(limit: Limit, override: Override | None) -> tuple[Limit, str]:
    """``limit`` with ``override``'s rate and capacity, and a note on the row saying what
    the code says when the override changes it ("" when nothing is overridden)."""
    if override is None:
        return limit, ""
    notes = []
    changed = override.limit(limit)
    if changed is not limit:
        notes.append(f"override (code {limit.rate}, capacity {limit.capacity})")
    if override.paused:
        notes.append("PAUSED")
    return changed, "; ".join(notes)


def concurrency_in_force(n: int, override: Override | None) -> tuple[int, str]:
    """N with ``override``'s concurrency, and a note as ``in_force`` makes."""
    if override is None:
        return n, ""
    notes = []
    if override.concurrency is not None and override.concurrency != n:
        notes.append(f"override (code concurrency {n})")
    if override.paused:
        notes.append("PAUSED")
    return override.concurrency or n, "; ".join(notes)


def idle_rows(
    runtime: Runtime,
    found: Found,
    overrides: dict[str, Override],
    name: str = "",
    parked: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """A ``status`` row for each configured funnel (of funnel ``name`` only, when given:
    a funnel name, or the key a row shows) none of whose keys was ``found`` in Redis
    (funnels and concurrency funnels): its limit in force (its ``limit`` name too),
    nothing used. ``parked``: the parked tasks by label (``ParkStore.counts``); a funnel
    with none is idle, one with some (paused, say) is not. Reading it touches no key."""
    seen = [*found.funnels, *concurrency_funnels(found)]
    rows = []
    for entry in configured(runtime):
        if (name and name not in (entry.name, entry.key)) or any(entry.owns(k) for k in seen):
            continue
        override = overrides.get(entry.name)
        waiting = parked_of(entry.name, parked or {})
        row: dict[str, Any] = {"key": entry.key, "name": entry.name}
        if not waiting:
            row["idle"] = True
        if entry.limit is not None:
            limit, note = in_force(entry.limit, override)
            strategy = strategies.get(limit.strategy)
            if limit.name is not None:
                row["limit"] = limit.name
            row.update(kind=strategy.name, rate=str(limit.rate), capacity=limit.capacity)
            row.update(remaining=limit.capacity, reset_after=0.0, parked=waiting)
            if strategy.reserve is not None:
                row["reservations"] = 0
        else:
            assert entry.concurrency is not None
            n, note = concurrency_in_force(entry.concurrency, override)
            row.update(kind="concurrency", capacity=n, in_use=0, remaining=n, parked=waiting)
        row["note"] = "; ".join(filter(None, ["" if waiting else "idle", entry.parts, note]))
        rows.append(row)
    return rows


def parked_of(name: str, counts: dict[str, int]) -> int:
    """The tasks parked on funnel ``name`` (a task name or ``limit:<pattern>``), from
    ``ParkStore.counts``: its labels may join several funnels with ``+``."""
    return sum(n for label, n in counts.items() if name in label.split("+"))
