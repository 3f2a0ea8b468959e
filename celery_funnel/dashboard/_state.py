"""What the dashboard shows, read from the funnels' Redis: every funnel of the app with
its limits, override, level, parked and waiting tasks, the keys of unique and debounced
tasks, and the per-second series the workers' live threads write (``_ops.live``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._celery.debounce import label_of
from .._celery.task import FunnelTask
from .._config.options import debounce_of, unique_of
from .._config.runtime import runtime_for
from .._limiter.errors import ConfigurationError
from .._limiter.keys import FunnelKey
from .._ops import control
from .._ops.configured import concurrency_in_force, configured
from .._ops.live import live_workers
from .._ops.view import Failure, Found, concurrency_funnels, describe, find, limit_of
from .._shared.live import SERIES_KEEP_SECONDS, series_key
from .._stores.concurrency import ConcurrencyStore
from .._stores.park import ParkStore

__all__ = ["ConcurrencyHook", "funnel_state", "series"]

WORKER_FRESH_SECONDS = 5.0  # a worker that has not written for this long is gone
KEYS_SHOWN = 50  # funnel keys (customers) peeked per funnel
HOUR = 3600

# how many tasks of a funnel run now under a concurrency limit, None when it has none:
# the dashboard shows what the hook returns (default: the holders of its leases)
ConcurrencyHook = Callable[[Any, str], "int | None"]


def no_concurrency(app: Any, name: str) -> int | None:
    """The default hook: the dashboard counts the funnel's lease holders itself."""
    return None


def _holders(app: Any, found: Found, known: Any) -> dict[str, list[int]]:
    """Lease holders per funnel name: one count per key of each concurrency funnel."""
    runtime = runtime_for(app)
    settings = runtime.settings
    store = ConcurrencyStore(runtime.funnel.client, settings.key_prefix, settings.lease_ttl)
    holders: dict[str, list[int]] = {}
    for key in concurrency_funnels(found):
        name = control.owner(app, key, known)
        if name is not None:
            holders.setdefault(name, []).append(len(store.holders(key.key)))
    return holders


def _seats(n: int | None, override: Any, in_use: list[int]) -> dict[str, Any] | None:
    """A concurrency funnel's seats as ``funnel status`` counts them: the N in force
    (``override`` applied) and the seats in use of its fullest key (None: no
    concurrency limit)."""
    if n is None:
        return None
    capacity, _ = concurrency_in_force(n, override)
    return {"used": max(in_use, default=0), "capacity": capacity, "keys": len(in_use)}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _waiting(client: Any, prefix: str) -> dict[str, int]:
    """Tasks the live workers hold, by funnel label."""
    total: dict[str, int] = {}
    for state in live_workers(client, prefix, WORKER_FRESH_SECONDS).values():
        for label, count in (state.get("waiting") or {}).items():
            total[label] = total.get(label, 0) + int(count)
    return total


def _of(name: str, by_label: dict[str, int]) -> int:
    """The count of funnel ``name`` among labels that may join several with ``+``."""
    return sum(n for label, n in by_label.items() if name in label.split("+"))


def _level(app: Any, keys: list[FunnelKey]) -> dict[str, Any]:
    """The fullest of the funnel's keys: units in use of its capacity."""
    runtime = runtime_for(app)
    backend = runtime.funnel
    best: dict[str, Any] = {"used": 0, "capacity": None, "keys": len(keys)}
    for key in keys[:KEYS_SHOWN]:
        row = describe(backend, key, limit_of(runtime, key))
        if "capacity" not in row or "remaining" not in row:
            continue
        used = int(row["capacity"]) - int(row["remaining"])
        if best["capacity"] is None or used > best["used"]:
            best.update(used=used, capacity=int(row["capacity"]))
    return best


def _dedupe(app: Any, found: Found, parked: dict[str, int]) -> list[dict[str, Any]]:
    """Per unique task, the keys held; per debounced task, the keys whose run waits."""
    rows = []
    held = [k for k in found.keys if k.companion == "unique"]
    tasks = list(app.tasks.values())  # a copy: the registry may change meanwhile
    for task in sorted(tasks, key=lambda t: str(t.name)):
        try:
            unique = unique_of(task) if isinstance(task, FunnelTask) else None
            debounce = debounce_of(task) if isinstance(task, FunnelTask) else None
        except ConfigurationError:  # the worker refuses to start, naming it
            continue
        if unique is not None:
            count = sum(k.of_task(task.name) for k in held)
            rows.append({"task": task.name, "kind": "unique", "keys": count})
        elif debounce is not None:
            count = parked.get(label_of(task.name), 0)
            rows.append({"task": task.name, "kind": "debounce", "keys": count})
    return rows


def funnel_state(app: Any, hook: ConcurrencyHook = no_concurrency) -> dict[str, Any]:
    """Every funnel of ``app``, as the dashboard's table shows it.

    Raises:
        BackendError, RedisError: when the funnels' Redis fails.
    """
    runtime = runtime_for(app)
    client, prefix, now = runtime.funnel.client, runtime.settings.key_prefix, time.time()
    entries = control.overrides(app)
    found = find(client, prefix)
    parked = ParkStore(client, prefix).counts() if runtime.settings.park else {}
    waiting = _waiting(client, prefix)
    by_name: dict[str, list[FunnelKey]] = {}
    known = control.families(app)
    for key in found.funnels:
        owner = control.owner(app, key, known)
        if owner is not None:
            by_name.setdefault(owner, []).append(key)
    holders = _holders(app, found, known)
    seats: dict[str, int] = {}  # the concurrency N in the code, by funnel name
    for entry in configured(runtime):
        if entry.concurrency is not None:
            seats.setdefault(entry.name, entry.concurrency)
    rows = []
    for name in control.funnel_names(app):
        override = entries.get(name)
        limits = control.code_limits(app, name)
        try:
            level = _level(app, by_name.get(name, []))
        except Failure as exc:
            level = {"error": str(exc)}
        rows.append({
            "name": name,
            "code": [{"rate": str(x.rate), "capacity": x.capacity, "strategy": x.strategy,
                      "limit": x.name} for x in limits],
            "concurrency": seats.get(name),
            "override": None if override is None else override.as_dict(),
            "level": level,
            "seats": _seats(seats.get(name), override, holders.get(name, [])),
            "parked": _of(name, parked),
            "held": _of(name, waiting),
            "running": sum(holders.get(name, [])) if hook is no_concurrency else hook(app, name),
        })  # fmt: skip
    return {"now": now, "funnels": rows, "dedupe": _dedupe(app, found, parked)}


def series(app: Any, since: float | None = None) -> dict[str, Any]:
    """Admitted and deferred decisions per second and funnel, over the last hour (after
    ``since`` only, when given: the page asks for what is new). Seconds without any
    decision are absent; the current second is left out (still being counted)."""
    runtime = runtime_for(app)
    client, prefix = runtime.funnel.client, runtime.settings.key_prefix
    now = int(time.time())
    start = now - HOUR if since is None else max(int(since) + 1, now - HOUR)
    minutes = range(start // 60, now // 60 + 1)
    pipe = client.pipeline(transaction=False)
    for minute in minutes:
        pipe.hgetall(series_key(prefix, minute))
    counts: dict[str, dict[int, list[int]]] = {}
    for raw in pipe.execute():
        for field, value in raw.items():
            label, second_text, kind = _text(field).rsplit("|", 2)
            second = int(second_text)
            if not start <= second < now:
                continue
            for name in label.split("+"):
                bucket = counts.setdefault(name, {}).setdefault(second, [0, 0])
                bucket[0 if kind == "a" else 1] += int(value)
    return {
        "start": start, "end": now, "keep": SERIES_KEEP_SECONDS,
        "funnels": {
            name: [[second, *pair] for second, pair in sorted(by_second.items())]
            for name, by_second in counts.items()
        },
    }  # fmt: skip
