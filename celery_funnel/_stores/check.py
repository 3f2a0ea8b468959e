"""Is this Redis fit to keep funnels? ``check`` answers with one ``Finding`` per problem:
unreachable or refusing credentials, ACL gaps (each script is run once on scratch keys
under the prefix), a read-only replica, an evicting ``maxmemory-policy``, persistence
off. Run by ``celery funnel check`` and, cheaply, at worker start (``report``)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from .._limiter.backends._faults import configuration_fault
from .._limiter.backends.redis import RedisFunnel
from .._limiter.errors import BackendConfigurationError, BackendError
from .._limiter.keys import funnel_key, tickets_key
from .park import ParkStore
from .persistence import aof_everywhere

__all__ = ["ACL_COMMANDS", "Finding", "acl_line", "check", "report"]

# Every command celery-funnel sends, its scripts' included (Redis checks a script's
# calls against the user's ACL): the gates, the parked tasks (hget ... zrangebyscore),
# then the CLI (scan ... config|get).
ACL_COMMANDS = (
    "evalsha", "eval", "script|load", "ping", "time", "get", "set", "del", "pexpire",
    "hmget", "hset", "hgetall", "zadd", "zrem", "zscore", "zcard", "zcount", "zrange",
    "zremrangebyscore", "hget", "hdel", "hincrby", "hlen", "hexists", "zrangebyscore",
    "zremrangebyrank", "exists",
    "scan", "type", "pttl", "info", "role", "config|get",
)  # fmt: skip
EVICTING = ("allkeys-", "volatile-")
# a Cluster client raises RedisClusterException (not a RedisError) for what it cannot route
Refused = (RedisError, RedisClusterException)


@dataclass(frozen=True)
class Finding:
    """One problem: ``level`` is "error" (funnels cannot work), "warning" (they work
    but may silently stop limiting) or "note"; ``topic`` names the area."""

    level: str
    topic: str
    message: str

    def line(self) -> str:
        """The finding as one log line."""
        return f"celery-funnel: {self.level}: {self.message}"


def acl_line(prefix: str, user: str = "funnel") -> str:
    """The ``ACL SETUSER`` line that gives ``user`` what celery-funnel needs, and only
    the keys under ``prefix``."""
    commands = " ".join(f"+{c}" for c in ACL_COMMANDS)
    return f"ACL SETUSER {user} on >PASSWORD resetkeys ~{prefix}* -@all {commands}"


def _error(topic: str, doing: str, exc: BaseException) -> Finding:
    cause = exc.__cause__ if isinstance(exc, (BackendError, BackendConfigurationError)) else exc
    fix = configuration_fault(cause) if isinstance(cause, RedisError) else None
    if fix is None:
        return Finding("error", topic, f"Redis failed {doing}: {exc}")
    return Finding("error", topic, f"Redis refused {doing}: {fix} (Redis said: {cause})")


def _scripts(funnel: RedisFunnel, prefix: str) -> Finding | None:
    """Run every script once on scratch keys (one slot, 1 s periods: they expire
    at once even when DEL is refused); the first failure, if any."""
    name = f"check:{uuid.uuid4().hex[:12]}"
    gcra, fixed, log, window = (funnel_key(prefix, name, str(i)) for i in range(4))
    calls: list[tuple[str, Callable[[], object]]] = [
        ("gcra.lua", lambda: funnel.throttle(gcra, 0, 1, 1)),
        ("reserve.lua", lambda: funnel.reserve(gcra, 0, 1, 1, ticket="check")),
        ("hold.lua", lambda: funnel.hold(gcra, 0, 1, 1, 0.001)),
        ("fixed_window.lua", lambda: funnel.fixed_window(fixed, 1, 1)),
        ("sliding_log.lua", lambda: funnel.sliding_log(log, 1, 1)),
        ("sliding_window.lua", lambda: funnel.sliding_window(window, 1, 1, windows=2)),
    ]
    parked = ParkStore(funnel.client, f"{prefix}{name}:")
    calls.append(("park*.lua", lambda: _park_round(parked)))
    try:
        for _, call in calls:
            call()
        funnel.client.delete(gcra, tickets_key(gcra), fixed, log, window, *parked.keys)
    except (BackendError, BackendConfigurationError, *Refused) as exc:
        return _error("scripts", "the funnel scripts on scratch keys under the prefix", exc)
    return None


def _park_round(store: ParkStore) -> None:
    """Park, claim, accept and forget one scratch entry: every parked-task script once."""
    meta = {"task": "check", "funnel": "check", "priority": None, "parked_at": 0.0}
    message = {"body": b"", "headers": {}, "meta": meta}
    store.park("check", 0.0, message, "")
    for release in store.claim(0.0, 1.0, 1, 1.0)[2]:
        store.accept(release.task_id, release.token)
        store.done(release)
    store.purge()


def _info(client: Any, section: str) -> dict[str, Any]:
    """``INFO section`` as one dict (a Cluster answers per node: the nodes merged)."""
    info = client.info(section)
    merged: dict[str, Any] = {}
    for value in info.values():
        if isinstance(value, dict):
            merged.update(value)
    return {**merged, **{k: v for k, v in info.items() if not isinstance(v, dict)}}


def _replica(client: Any) -> Finding | None:
    try:
        role = client.execute_command("ROLE")
    except Refused:
        return None  # ROLE refused: the scripts' writes tell a replica anyway
    first = role[0] if isinstance(role, list) and role else b""
    if (first.decode() if isinstance(first, bytes) else str(first)) in ("slave", "replica"):
        return Finding(
            "error", "replica", "funnel_redis_url points at a replica: point it at the master"
        )
    return None


def _eviction(client: Any) -> Finding | None:
    try:
        policy = str(_info(client, "memory").get("maxmemory_policy", ""))
    except Refused as exc:
        return Finding("note", "eviction", f"cannot read maxmemory-policy ({exc}): make sure"
                       " it is noeviction")  # fmt: skip
    if policy.startswith(EVICTING):
        return Finding(
            "warning", "eviction",
            f"maxmemory-policy is {policy}: under memory pressure Redis evicts funnel keys,"
            " and an evicted funnel lets every task through; set noeviction (or give the"
            " funnels a Redis of their own)",
        )  # fmt: skip
    return None


def _persistence(client: Any, parking: bool | str) -> Finding | None:
    try:
        aof = aof_everywhere(client)  # a Cluster: on every master
        save = client.config_get("save").get("save", "") if not aof else "aof"
    except Refused:
        return None  # CONFIG refused (managed Redis): nothing to say
    if aof:
        return None
    if parking is True:
        return Finding(
            "error", "persistence",
            "funnel_park=True, but this Redis has no append-only file: a restart would lose"
            " every parked task, so the worker refuses to start; turn on AOF (appendonly"
            " yes) or set funnel_park='auto'",
        )  # fmt: skip
    if parking:
        return Finding(
            "note", "persistence",
            "no append-only file: no task is parked here (a restart would lose it); long"
            " waits go back to the broker with capped countdowns; turn on AOF (appendonly"
            " yes) to park them" + ("" if save else ". With no RDB save either, a restart"
            " forgets every funnel, and each lets one full burst through"),
        )  # fmt: skip
    if not save:
        return Finding(
            "note", "persistence",
            "persistence is off (no AOF, no RDB save): a Redis restart forgets every"
            " funnel, and each lets one full burst through",
        )  # fmt: skip
    return None


def check(funnel: RedisFunnel, prefix: str, *, parking: bool | str = False) -> list[Finding]:
    """Every problem found with ``funnel``'s Redis for keys under ``prefix``; [] when
    it is fit. ``parking``: ``funnel_park`` (parking needs an append-only file).
    Never raises for Redis errors: they become findings."""
    client = funnel.client
    try:
        client.ping()
    except Refused as exc:
        return [_error("connection", "PING", exc)]
    scripts = _scripts(funnel, prefix)
    # a replica refuses the scripts' writes already: one line per problem
    replica = None if scripts is not None and "replica" in scripts.message else _replica(client)
    findings = [scripts, replica, _eviction(client), _persistence(client, parking)]
    return [f for f in findings if f is not None]


def report(findings: Iterable[Finding], logger: logging.Logger) -> None:
    """Log each finding on one line: errors as ERROR, warnings as WARNING, notes INFO."""
    levels = {"error": logging.ERROR, "warning": logging.WARNING}
    for finding in findings:
        logger.log(
            levels.get(finding.level, logging.INFO),
            finding.line(),
            extra={"celery_funnel": {"event": "backend_check", "topic": finding.topic}},
        )
