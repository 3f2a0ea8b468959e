"""Redis failures told apart: transient ones (an outage) from configuration faults
(``configuration_fault``), which waiting cannot cure and which say what to fix."""

from __future__ import annotations

import re

from redis import exceptions as rx

__all__ = ["configuration_fault"]

_ACL = (
    "the Redis ACL user lacks a permission: grant the commands and the key pattern that"
    " `celery funnel check` prints"
)
_REPLICA = (
    "funnel_redis_url points at a read-only replica: point it at the master (or use"
    " redis+sentinel:// to follow failovers)"
)
_OOM = (
    "Redis is out of memory (maxmemory reached under maxmemory-policy noeviction): raise"
    " maxmemory, free memory, or give the funnels a Redis of their own"
)
# (error class, or a word of a ResponseError's text: Redis 6 reports an error inside a
# script as "ERR Error running script ...: NOPERM ...") -> what to fix; first match wins
_FAULTS: tuple[tuple[type[BaseException] | str, str], ...] = (
    (rx.AuthenticationError, "Redis refused the credentials: fix the user/password in"
     " funnel_redis_url (or the server's requirepass / ACL user)"),
    (rx.AuthenticationWrongNumberOfArgsError, "Redis refused the credentials: this server"
     " takes a password only (no user name) in funnel_redis_url"),
    (rx.AuthorizationError, "Redis refused the user: fix its ACL (see celery funnel check)"),
    (rx.NoPermissionError, _ACL),
    (rx.ReadOnlyError, _REPLICA),
    (rx.OutOfMemoryError, _OOM),
    (rx.ClusterCrossSlotError, "keys of one funnel landed in different Cluster slots: a"
     " custom key without the layout's {hash tag}"),
    ("WRONGTYPE", "a funnel key holds another type of value (another app's key under"
     " funnel_key_prefix, or a funnel whose strategy changed): `celery funnel reset` it or"
     " change funnel_key_prefix"),
    ("NOAUTH", "Redis requires a password: add it to funnel_redis_url"),
    ("NOPERM", _ACL),
    ("no permissions", _ACL),  # Redis 6.2/7.0 inside a script, without the NOPERM code
    ("can't run this command", _ACL),
    ("READONLY", _REPLICA),
    ("OOM", _OOM),
    ("unknown command", "a command celery-funnel needs is renamed or disabled on this"
     " Redis (EVALSHA, SCRIPT LOAD?): enable it"),
)  # fmt: skip


def configuration_fault(error: BaseException) -> str | None:
    """What to fix, when the redis-py ``error`` is a configuration fault that waiting
    cannot cure; None when it is transient (an outage, handled by the policy)."""
    for kind, fix in _FAULTS:
        if isinstance(kind, str):
            if isinstance(error, rx.ResponseError) and re.search(rf"\b{kind}\b", str(error)):
                return fix
        elif isinstance(error, kind):
            return fix
    return None
