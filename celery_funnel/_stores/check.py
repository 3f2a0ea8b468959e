"""Is this Redis fit to keep funnels? ``check`` answers with one ``Finding`` per problem:
unreachable or refusing credentials, ACL gaps (each script is run once on scratch keys
under the prefix), a read-only replica, an evicting ``maxmemory-policy``, persistence
off (and whether tasks are parked there: ``Persistence``). Run by ``celery funnel
check`` and, cheaply, at worker start (``report``)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from .._limiter import strategies
from .._limiter.backends._faults import configuration_fault
from .._limiter.backends.redis import RedisFunnel
from .._limiter.errors import BackendConfigurationError, BackendError
from .._limiter.keys import funnel_key, tickets_key
from .._limiter.limit import Limit
from .._limiter.rate import Rate
from .park import ParkStore
from .persistence import Persistence, Rule, aof_everywhere, info_per_node

__all__ = ["ACL_COMMANDS", "Finding", "acl_line", "check", "report"]

# Every command celery-funnel sends, its scripts' included (Redis checks a script's
# calls against the user's ACL): the gates, the parked tasks (hget ... zrangebyscore),
# then the CLI (scan ... config|get).
ACL_COMMANDS = (
    "evalsha", "eval", "script|load", "ping", "time", "get", "set", "del", "pexpire",
    "hmget", "hset", "hgetall", "zadd", "zrem", "zscore", "zcard", "zcount", "zrange",
    "zremrangebyscore", "hget", "hdel", "hincrby", "hlen", "hexists", "zrangebyscore",
    "zremrangebyrank", "exists", "zrevrangebyscore", "publish", "subscribe",
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
    the keys and pub/sub channels (a seat handed to a waiter held in its worker) under
    ``prefix``."""
    commands = " ".join(f"+{c}" for c in ACL_COMMANDS)
    where = f"resetkeys ~{prefix}* resetchannels &{prefix}*"
    return f"ACL SETUSER {user} on >PASSWORD {where} -@all {commands}"


def _error(topic: str, doing: str, exc: BaseException) -> Finding:
    cause = exc.__cause__ if isinstance(exc, (BackendError, BackendConfigurationError)) else exc
    fix = configuration_fault(cause) if isinstance(cause, RedisError) else None
    if fix is None:
        return Finding("error", topic, f"Redis failed {doing}: {exc}")
    return Finding("error", topic, f"Redis refused {doing}: {fix} (Redis said: {cause})")


def _scripts(funnel: RedisFunnel, prefix: str) -> Finding | None:
    """Run every script once on scratch keys (one slot, 1 s periods: they expire
    at once even when DEL is refused): each registered strategy's decision (and its
    booking, when it books), GCRA's hold, the parked tasks'; the first failure, if any."""
    name = f"check:{uuid.uuid4().hex[:12]}"
    gcra = funnel_key(prefix, name, "hold")
    scratch = [gcra, tickets_key(gcra)]
    calls: list[tuple[str, Callable[[], object]]] = [
        ("hold.lua", lambda: funnel.hold(gcra, 0, 1, 1, 0.001)),
    ]
    for kind in strategies.names():
        strategy, key = strategies.get(kind), funnel_key(prefix, name, kind)
        spec = Limit(Rate(1, 1), strategy=kind, windows=2)
        scratch += [key, tickets_key(key)]
        calls.append((f"{kind}'s script", partial(strategy.decide, funnel, key, spec, 1)))
        if strategy.reserve is not None:
            book = partial(strategy.reserve, funnel, key, spec, 1, "check", False, None)
            calls.append((f"{kind}'s booking", book))
    parked = ParkStore(funnel.client, f"{prefix}{name}:")
    calls.append(("park*.lua", lambda: _park_round(parked)))
    try:
        for _, call in calls:
            call()
        funnel.client.delete(*scratch, *parked.keys)
    except (BackendError, BackendConfigurationError, *Refused) as exc:
        return _error("scripts", "the funnel scripts on scratch keys under the prefix", exc)
    return None


def _park_round(store: ParkStore) -> None:
    """Park, claim and accept one scratch entry: every parked-task script once."""
    meta = {"task": "check", "funnel": "check", "priority": None, "parked_at": 0.0}
    message = {"body": b"", "headers": {}, "meta": meta}
    store.park("check", 0.0, message, "")
    for release in store.claim(0.0, 1.0, 1, 1.0)[2]:
        store.accept(release.task_id, release.token)
    store.purge()


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
    try:  # the first evicting policy of any master
        policies = [
            str(node.get("maxmemory_policy", "")) for node in info_per_node(client, "memory")
        ]
        policy = next((p for p in policies if p.startswith(EVICTING)), "")
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


def _persistence(client: Any, parking: bool | str, persistence: Persistence) -> Finding | None:
    """What the rule for parking (``Persistence``, the one decision the workers take)
    says of this Redis, when there is something to say."""
    try:
        aof = aof_everywhere(client)  # a Cluster: on every master
        save = client.config_get("save").get("save", "") if not aof else "aof"
    except Refused:
        return None  # CONFIG refused (managed Redis): nothing to say
    if aof:
        return None
    rule = persistence.rule() if parking else None
    why = f" ({persistence.broker_why})" if persistence.broker_why else ""
    if rule is not Rule.BROKER and parking is True:
        return Finding(
            "error", "persistence",
            f"funnel_park=True, but this Redis has no append-only file and is not the"
            f" broker's Redis server{why}: a restart would lose every parked task, so the"
            f" worker refuses to start; turn on AOF (appendonly yes), keep the funnels on"
            f" the broker's Redis, or set funnel_park='auto'",
        )  # fmt: skip
    # where tasks may be parked is said once, by the parking rule (the worker's start
    # line "parking is on: ...", the command's "parking: ..."): only the funnels here
    if not save:
        return Finding(
            "note", "persistence",
            "persistence is off (no AOF, no RDB save): a Redis restart forgets every"
            " funnel, and each lets one full burst through",
        )  # fmt: skip
    return None


def check(
    funnel: RedisFunnel,
    prefix: str,
    *,
    parking: bool | str = False,
    persistence: Persistence | None = None,
) -> list[Finding]:
    """Every problem found with ``funnel``'s Redis for keys under ``prefix``; [] when
    it is fit. ``parking``: ``funnel_park``; ``persistence``: the rule for parking
    (an append-only file, or the broker's own server; without it, AOF alone).
    Never raises for Redis errors: they become findings."""
    client = funnel.client
    try:
        client.ping()
    except Refused as exc:
        return [_error("connection", "PING", exc)]
    scripts = _scripts(funnel, prefix)
    # a replica refuses the scripts' writes already: one line per problem
    replica = None if scripts is not None and "replica" in scripts.message else _replica(client)
    persistence = persistence or Persistence(lambda: client, parking)
    findings = [scripts, replica, _eviction(client), _persistence(client, parking, persistence)]
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
