"""What ``celery funnel`` shows: the app's funnel keys found in Redis (only keys that
parse as keys of the layout), each with its limit and the state the core computes
(a peek through the strategy registry: nothing taken), and times in UTC."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from redis.exceptions import RedisError

from .._celery.task import FunnelTask
from .._config.options import limits_of
from .._config.runtime import Runtime
from .._limiter import strategies
from .._limiter.backends.redis import RedisFunnel
from .._limiter.errors import BackendConfigurationError, BackendError
from .._limiter.keys import (
    FunnelKey,
    is_live_key,
    is_parked_key,
    parse_key,
    scan_pattern,
    tickets_key,
)
from .._limiter.limit import Limit
from .._shared.adaptive import adaptive_key
from .._stores.fair import fair_status
from .._stores.unique import UniqueStore

__all__ = [
    "Found",
    "adaptive_rates",
    "adaptive_text",
    "at",
    "concurrency_funnels",
    "describe",
    "fair_lines",
    "find",
    "limit_of",
    "resolve",
    "unique_rows",
    "utc_time",
]  # fmt: skip

Failure = (BackendError, BackendConfigurationError, RedisError)


class Found:
    """The keys of the layout under the prefix (funnels and companions), and how many
    other keys the scan met there (foreign keys, left alone)."""

    def __init__(self) -> None:
        self.keys: list[FunnelKey] = []
        self.foreign = 0
        self.parked = 0  # keys of the parked tasks (shown apart)
        self.live = 0  # keys of overrides and the charts' series (shown apart)

    @property
    def funnels(self) -> list[FunnelKey]:
        """The funnels themselves, companions aside, sorted by key."""
        own = {k.key: k for k in self.keys if not k.companion}
        for k in self.keys:  # a fair funnel with waiting tasks, its TAT expired
            if k.companion == "fair" and k.funnel not in own:
                own[k.funnel] = FunnelKey(k.funnel, k.name, k.rest)
        return sorted(own.values(), key=lambda k: k.key)


def find(client: Any, prefix: str, name: str = "") -> Found:
    """Scan for the keys under ``prefix`` (funnel ``name`` and its key parts only, when
    given). The glob is escaped; every key is parsed, so nothing else is returned."""
    found = Found()
    for raw in client.scan_iter(match=scan_pattern(prefix, name), count=1000):
        parsed = parse_key(prefix, raw)
        if parsed is None and is_parked_key(prefix, raw):
            found.parked += 1
        elif parsed is None and is_live_key(prefix, raw):
            found.live += 1
        elif parsed is None or (name and not parsed.in_family(name)):
            found.foreign += 1
        else:
            found.keys.append(parsed)
    return found


def _limits(runtime: Runtime) -> Iterator[tuple[str, int | None, Limit]]:
    """(task name or "", limit index, limit): every FunnelTask's limits, then every
    worker-wide limit (task name "")."""
    for task in list(runtime.app.tasks.values()):
        if isinstance(task, FunnelTask):
            limits = limits_of(task)
            for i, limit in enumerate(limits):
                yield task.name, None if len(limits) == 1 else i, limit
    for limit in runtime.settings.limits:
        yield "", None, limit


def limit_of(runtime: Runtime, key: FunnelKey) -> Limit | None:
    """The app's limit that funnel ``key`` belongs to, if any."""
    for task_name, index, limit in _limits(runtime):
        if key.of_task(task_name, index) if task_name else key.of_limit(limit.pattern):
            return limit
    return None


def adaptive_rates(client: Any, prefix: str) -> dict[str, float]:
    """The adaptive funnels below their max: funnel key -> units per second."""
    rates: dict[str, float] = {}
    for raw, value in client.hgetall(adaptive_key(prefix)).items():
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        text = value.decode() if isinstance(value, bytes) else str(value)
        rates[key] = 1_000_000 / int(text.split()[0])
    return rates


def adaptive_text(rate: float | None, limit: Limit) -> str:
    """How ``status`` shows an adaptive funnel's rate now (``rate``: units per second,
    None at its max), in the unit of the limit's rate."""
    assert limit.adaptive is not None
    unit, period = str(limit.rate).split("/", 1)[1], limit.rate.period
    low = limit.adaptive.min.per_second * period
    if rate is None:
        return f"{limit.rate} (at its max; min {low:.3g}/{unit})"
    return f"{rate * period:.3g}/{unit} (max {limit.rate}, min {low:.3g}/{unit}; lowered by 429s)"


def utc_time(epoch: float) -> str:
    """An instant as UTC, 24-hour, to the second: what every command prints."""
    when = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    return f"{when:%Y-%m-%d %H:%M:%S} UTC"


def at(epoch: float, now: float) -> str:
    """An instant as UTC with milliseconds, and its distance from ``now``."""
    when = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    delta = epoch - now
    distance = f"in {delta:.3f} s" if delta >= 0 else f"{-delta:.3f} s ago"
    return f"{when:%Y-%m-%d %H:%M:%S}.{when.microsecond // 1000:03d} UTC ({distance})"


def describe(funnel: RedisFunnel, key: FunnelKey, limit: Limit | None) -> dict[str, Any]:
    """One funnel's row: its limit, and what a peek (quantity 0) says of it now."""
    row: dict[str, Any] = {"key": key.key, "name": key.name}
    try:
        client = funnel.client
        ttl = client.pttl(key.key)
        row["expires_in"] = None if ttl < 0 else ttl / 1000
        if limit is None:
            kind = client.type(key.key)
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            row["kind"] = f"{kind} (no limit of this app)"
            return row
        strategy = strategies.get(limit.strategy)
        row.update(kind=strategy.name, rate=str(limit.rate), capacity=limit.capacity)
        if limit.name is not None:
            row["limit"] = limit.name
        peek = strategy.decide(funnel, key.key, limit, 0)
        row.update(remaining=peek.remaining, reset_after=round(peek.reset_after, 6))
        if strategy.reserve is not None:
            row["reservations"] = client.zcard(tickets_key(key.key))
        if limit.fair_by is not None:
            row["fair"] = [r._asdict() for r in fair_status(client, key.key)]
    except Failure as exc:  # another type of value under the key, a refused command
        row["error"] = str(exc)
    return row


def fair_lines(row: dict[str, Any]) -> list[str]:
    """A fair funnel's tenants, one line each, for ``status``."""
    return [
        f"  tenant {t['tenant']}: {t['waiting']} deferred, {t['admitted_per_second']}/s admitted"
        for t in row.get("fair", ())
    ]


def resolve(runtime: Runtime, client: Any, name: str) -> Found:
    """The keys of funnel ``name``: a full key of the layout (the funnel and its
    companions), or a funnel name (it and its key parts, ``name:<part>``)."""
    prefix = runtime.settings.key_prefix
    parsed = parse_key(prefix, name)
    if parsed is None:
        return find(client, prefix, name)
    found = Found()
    funnel_key = parse_key(prefix, parsed.funnel)
    assert funnel_key is not None
    companions = find(client, prefix, funnel_key.name).keys
    found.keys = [k for k in companions if k.funnel == funnel_key.key]
    return found


def concurrency_funnels(found: Found) -> list[FunnelKey]:
    """The concurrency funnels among the keys found (those with leases or waiters)."""
    seen = {k.funnel: k for k in found.keys if k.companion in ("leases", "waiters")}
    return [FunnelKey(funnel, k.name, k.rest) for funnel, k in sorted(seen.items())]


def unique_rows(client: Any, found: Found) -> list[dict[str, Any]]:
    """One row per unique key held (``funnel_unique``): the task holding it, and the
    seconds its claim has left unless renewed."""
    store, rows = UniqueStore(client), []
    for key in sorted((k for k in found.keys if k.companion == "unique"), key=lambda k: k.key):
        row: dict[str, Any] = {"key": key.funnel, "name": key.name, "kind": "unique"}
        try:
            held = store.holder(key.funnel)
        except BackendError as exc:
            row["error"] = str(exc)
        else:
            if held is None:
                continue  # freed since the scan
            row["held_by"], row["expires_in"] = held
        rows.append(row)
    return rows
