"""Live control of funnels: overrides, pause and resume, kept in the funnels' Redis;
what the public ``celery_funnel.control`` offers, and the rebase and release a worker's
live thread applies when an override changes."""

from __future__ import annotations

import dataclasses
import getpass
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from .._celery.task import FunnelTask
from .._config.options import concurrency_of, limits_of
from .._config.runtime import Runtime, runtime_for
from .._limiter.errors import ConfigurationError
from .._limiter.keys import FunnelKey, live_key, parse_key, ranks_key, tickets_key
from .._limiter.limit import Limit
from .._limiter.scripts import Script, run_script
from .._limiter.strategies import capabilities
from .._limiter.strategies.gcra import funnel_shape
from .._limiter.values import did_you_mean
from .._shared.overrides import Override, parse_ttl
from .._stores.park import ParkStore
from .view import adaptive_rates as adaptive_rates_of
from .view import find, limit_of

__all__ = [
    "Override", "adaptive_rates", "code_concurrency", "code_limits", "families", "funnel_names",
    "overrides", "owner",
    "pause",
    "rebase", "release_parked", "resume", "set_override", "unset",
]  # fmt: skip

LIMIT_PREFIX = "limit:"
REBASE = Script.load("rebase")  # a funnel whose limit changed: lua/rebase.lua


def funnel_names(app: Any) -> list[str]:
    """Every funnel name of ``app`` that can be overridden: its FunnelTasks with a limit
    (a rate, or ``funnel_concurrency``), then ``limit:<pattern>`` for each worker-wide
    limit (a rate, or a concurrency)."""
    settings = runtime_for(app).settings
    tasks = sorted(
        t.name
        for t in list(app.tasks.values())
        if isinstance(t, FunnelTask) and (limits_of(t) or concurrency_of(t) is not None)
    )
    patterns = [x.pattern for x in settings.limits] + [x.pattern for x in settings.concurrency]
    return tasks + [f"{LIMIT_PREFIX}{p}" for p in dict.fromkeys(patterns) if p is not None]


def code_limits(app: Any, name: str) -> tuple[Limit, ...]:
    """The limits funnel ``name`` has in the code (empty for an unknown name)."""
    if name.startswith(LIMIT_PREFIX):
        pattern = name[len(LIMIT_PREFIX) :]
        return tuple(x for x in runtime_for(app).settings.limits if x.pattern == pattern)
    task = app.tasks.get(name)
    return limits_of(task) if isinstance(task, FunnelTask) else ()


def code_concurrency(app: Any, name: str) -> int | None:
    """The concurrency N funnel ``name`` has in the code (None: none)."""
    if name.startswith(LIMIT_PREFIX):
        pattern = name[len(LIMIT_PREFIX) :]
        found = [x.n for x in runtime_for(app).settings.concurrency if x.pattern == pattern]
        return found[0] if found else None
    task = app.tasks.get(name)
    return concurrency_of(task) if isinstance(task, FunnelTask) else None


def _check_name(app: Any, name: str) -> None:
    known = funnel_names(app)
    if name not in known:
        raise ConfigurationError(
            f"no funnel {name!r} in this app{did_you_mean(name, known)}; its funnels:"
            f" {', '.join(known) or 'none'}"
        )


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in a container
        user = "?"
    return f"{user}@{socket.gethostname()}"


def _stamp(by: str | None, ttl: str | float | None) -> dict[str, Any]:
    seconds, now = parse_ttl(ttl), time.time()
    return {"by": by or _who(), "at": now, "expires_at": None if seconds is None else now + seconds}


def _key(runtime: Runtime) -> str:
    return live_key(runtime.settings.key_prefix, "overrides")


def _change(
    app: Any, name: str, change: Callable[[Override | None], Override | None]
) -> tuple[Override | None, Override | None]:
    """Apply ``change`` to funnel ``name``'s stored override atomically (WATCH: two
    operators at once do not lose either change); returns (before, after)."""
    runtime = runtime_for(app)
    client, key = runtime.funnel.client, _key(runtime)
    result: list[Override | None] = []

    def update(pipe: Any) -> None:
        text = pipe.hget(key, name)
        before = None if text is None else Override.from_json(text)
        if before is not None and before.expired(time.time()):
            before = None
        after = change(before)
        pipe.multi()
        if after is None or after.empty:
            pipe.hdel(key, name)
        else:
            pipe.hset(key, name, after.to_json())
        result[:] = [before, None if after is None or after.empty else after]

    client.transaction(update, key)
    return result[0], result[1]


def set_override(
    app: Any,
    name: str,
    rate: str | float | None = None,
    *,
    capacity: int | None = None,
    concurrency: int | None = None,
    ttl: str | float | None = None,
    by: str | None = None,
) -> Override:
    """Override funnel ``name``'s rate (``"20/s"``, ``"0.5/s"``, ``5``), capacity and/or
    concurrency (None: the code's), for ``ttl`` (seconds, or ``"30m"``, ``"1h"``...; None:
    until unset). A pause stays as it was. ``by``: who (default: user@host).

    Raises:
        ConfigurationError: naming an unknown funnel or a bad value.
    """
    _check_name(app, name)
    if rate is None and capacity is None and concurrency is None:
        raise ConfigurationError("funnel set needs a rate, a capacity or a concurrency")
    stamp = _stamp(by, ttl)
    fresh = Override.checked(rate, capacity, concurrency, **stamp)

    def changed(old: Override | None) -> Override:
        return dataclasses.replace(fresh, paused=bool(old and old.paused))

    after = _change(app, name, changed)[1]
    assert after is not None  # a rate, capacity or concurrency: never empty
    return after


def pause(
    app: Any, name: str, *, ttl: str | float | None = None, by: str | None = None
) -> Override:
    """Pause funnel ``name``: nothing of it starts; waiting tasks are parked (and so
    released at once when it resumes). With ``ttl``, the pause ends by itself."""
    _check_name(app, name)
    stamp = _stamp(by, ttl)

    def paused(old: Override | None) -> Override:
        base = old or Override()
        return Override(base.rate, base.capacity, base.concurrency, True, **stamp)

    after = _change(app, name, paused)[1]
    assert after is not None
    return after


def resume(app: Any, name: str, *, by: str | None = None) -> Override | None:
    """Resume funnel ``name`` (its other overrides stay); returns what remains."""
    _check_name(app, name)
    stamp = _stamp(by, None)

    def resumed(old: Override | None) -> Override | None:
        if old is None:
            return None
        return Override(old.rate, old.capacity, old.concurrency, False, **{
            **stamp, "expires_at": old.expires_at,
        })  # fmt: skip

    # each worker releases the parked tasks once it sees the pause end (released now,
    # a worker that has not seen it yet would park them again)
    return _change(app, name, resumed)[1]


def unset(app: Any, name: str) -> bool:
    """Remove funnel ``name``'s override: back to the code's limit, resumed. Whether
    there was one."""
    _check_name(app, name)
    return _change(app, name, lambda old: None)[0] is not None


def overrides(app: Any) -> dict[str, Override]:
    """Every override in force, by funnel name; expired ones are deleted on the way."""
    runtime = runtime_for(app)
    client, key, now = runtime.funnel.client, _key(runtime), time.time()
    found: dict[str, Override] = {}
    for raw_name, text in client.hgetall(key).items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
        try:
            entry = Override.from_json(text)
        except ConfigurationError:
            continue
        if entry.expired(now):
            client.hdel(key, name)
        else:
            found[name] = entry
    return found


def _family(runtime: Runtime, name: str) -> str:
    """The name funnel ``name``'s keys carry in their hash tag."""
    if name.startswith(LIMIT_PREFIX):
        key = runtime.limit_key(name[len(LIMIT_PREFIX) :])
    else:
        key = runtime.task_key(name)
    parsed = parse_key(runtime.settings.key_prefix, key)
    assert parsed is not None
    return parsed.name


def families(app: Any) -> dict[str, str]:
    """The name each funnel's keys carry in their hash tag -> the funnel's name."""
    runtime = runtime_for(app)
    return {_family(runtime, name): name for name in funnel_names(app)}


def owner(app: Any, key: FunnelKey, known: dict[str, str] | None = None) -> str | None:
    """The funnel name (as overrides name it) that funnel ``key`` belongs to, if any;
    ``known``: ``families(app)``, when asking for many keys."""
    for family, name in (known or families(app)).items():
        if key.in_family(family):
            return name
    return None


def _gcra_funnels(runtime: Runtime, name: str) -> Iterator[tuple[str, Limit]]:
    """Funnel ``name``'s GCRA keys in Redis, each with its limit in the code."""
    client = runtime.funnel.client
    for key in find(client, runtime.settings.key_prefix, _family(runtime, name)).funnels:
        limit = limit_of(runtime, key)
        own = limit is not None and (
            key.of_limit(limit.pattern) if limit.pattern is not None else True
        )
        if limit is not None and own and capabilities(limit.strategy).rebases:
            yield key.key, limit


def rebase(app: Any, name: str, override: Override | None) -> int:
    """Funnel ``name``'s limit changed to ``override`` (None: the code's): rebase its
    GCRA funnels (``lua/rebase.lua``: bookings at the old pace dropped, a backlog past
    the new tolerance cut) and release its parked tasks to decide anew. Each worker's
    live thread calls it as it takes the change up, then wakes the tasks it holds.
    Returns how many bookings were dropped."""
    runtime = runtime_for(app)
    client = runtime.funnel.client
    dropped = 0
    for key, limit in _gcra_funnels(runtime, name):
        new = limit if override is None else override.limit(limit)
        _, _, tau = funnel_shape(new.capacity - 1, new.rate.count, new.rate.period)
        keys = [key, tickets_key(key), ranks_key(key)]
        dropped += int(run_script(client, REBASE, keys, [tau, ""])[0])
    release_parked(app, name)
    return dropped


def release_parked(app: Any, name: str) -> int:
    """Make every parked task that funnel ``name`` deferred due now (they decide again
    under what is in force). How many."""
    runtime = runtime_for(app)
    if not runtime.settings.park:
        return 0
    store = ParkStore(runtime.funnel.client, runtime.settings.key_prefix)
    labels = [label for label in store.counts() if name in label.split("+")]
    return sum(store.purge(label, release=True) for label in labels)


def adaptive_rates(app: Any) -> dict[str, float]:
    """The adaptive funnels (``"adaptive"`` in a limit) running below their code's rate
    now: funnel key -> units per second. A funnel at its max is not listed."""
    runtime = runtime_for(app)
    client = runtime.funnel.client
    return adaptive_rates_of(client, runtime.settings.key_prefix)
