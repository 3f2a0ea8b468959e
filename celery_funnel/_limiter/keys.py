"""The key layout: the one place that knows how celery-funnel names its Redis keys.

Every key the Celery layer writes is ``<prefix>{<funnel name>}<suffix>``:

- ``<prefix>`` is ``funnel_key_prefix`` (default ``funnel:``); it comes first, so an
  ACL ``~<prefix>*`` and ``SCAN MATCH <prefix>*`` see every key, and nothing else;
- ``{<funnel name>}`` is a Redis Cluster hash tag: a funnel and its companions share
  one slot. Names are made of ``safe_part`` text only (no braces, no ``#``);
- ``<suffix>`` is empty, or ``:<limit index>[:<key part>]`` when a task has several
  limits (checked together in one script, so under one tag), then optionally a
  companion mark: ``#tickets`` for the reservation tickets beside a GCRA funnel and
  ``#ranks`` for their priority ranks.

Funnel names: a FunnelTask with one limit is ``<task>`` or ``<task>:<key part>``
(every key part its own slot, so a Cluster spreads customers); with several limits the
name is ``<task>`` and each limit's key is ``:<index>[:<key part>]`` after it. A
worker-wide ``funnel_limits`` entry is ``limit:<pattern>``, or
``limit:<pattern>:<worker>`` with ``"scope": "worker"``.

A concurrency limit (``_stores.concurrency``) keeps its seats beside its funnel's key,
in the same Cluster slot: ``#leases`` (task id -> end of its lease), ``#lease-info`` (who
holds each seat) and ``#waiters`` (the parked tasks waiting for a seat, the broker's
priority first, then arrival).

Parked tasks (``_stores.park``) share one tag of their own, ``{~parked}`` (no funnel name
starts with ``~``): ``<prefix>{~parked}#due``, ``#entries``, ``#claims``, ``#leases``,
``#accepted``, ``#accepted-at``, ``#labels``, ``#counts`` and ``#fair`` (the
fair-share funnels with waiting tasks). A fair-share funnel's companions are
``#fair``, ``#fair-q``, ``#fair-ids``, ``#fair-meta``, ``#fair-r0..2`` and ``#fair-heads``
(``_stores.fair``). Parked tasks are tasks, not
funnel state: ``parse_key`` does not take them, so ``reset`` never deletes them
(``purge`` does).

Keys of the layout before 0.3 (``{<key>}:tickets``, ``{<key>}:<n>`` sliding-window
counters) are never read again and expire by themselves (at most one period).
Live operation (``control``, ``_ops.live``) shares another tag, ``{~live}``:
``<prefix>{~live}#overrides`` (hash: funnel name -> override JSON) and
``<prefix>{~live}#series:<minute>`` (hash: admitted/refused counts per second of one
minute, expiring after an hour). ``parse_key`` does not take them either.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

__all__ = [
    "DEFAULT_PREFIX",
    "ConcurrencyKeys",
    "FunnelKey",
    "ParkedKeys",
    "companion_key",
    "concurrency_keys",
    "debounce_key",
    "fair_keys",
    "fair_registry_key",
    "funnel_key",
    "glob_escape",
    "handed_channel",
    "hash_tag",
    "is_live_key",
    "is_parked_key",
    "limit_key",
    "live_key",
    "parked_keys",
    "parse_key",
    "ranks_key",
    "safe_part",
    "scan_pattern",
    "task_key",
    "tickets_key",
    "unique_key",
]

DEFAULT_PREFIX = "funnel:"  # funnel_key_prefix's default
_SAFE_CHARS = r"A-Za-z0-9_.:@*?=+\-"
_SAFE = re.compile(f"[{_SAFE_CHARS}]{{1,64}}")
# what safe_part can produce: its safe text, or "~" and hex digits
_NAME = f"[{_SAFE_CHARS}~]+"
COMPANION_MARK = "#"
TICKETS = "tickets"
RANKS = "ranks"
CONCURRENCY_PARTS = ("leases", "lease-info", "waiters")
BACKLOG = "backlog"  # the tasks sent and not yet started (funnel_max_waiting)
UNIQUE = "unique"  # the task id holding a unique task's key (funnel_unique)
DEBOUNCE = "debounce"  # beside the parked tasks: a debounced key's window
LIMIT_NAME = "limit"
_HASHED = re.compile("~[0-9a-f]{24}")
_GLOB = re.compile(r"([*?\[\]\\])")


def safe_part(value: object) -> str:
    """A key part that cannot escape its prefix, break a ``{hash tag}`` or grow without
    bound: short plain text is kept, anything else (long, binary, braces, spaces,
    non-ASCII) becomes ``~`` and 24 hex digits of its SHA-256."""
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    text = raw.decode("ascii", "replace")
    if _SAFE.fullmatch(text) and not text.startswith("~"):
        return text
    return "~" + hashlib.sha256(raw).hexdigest()[:24]


def hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes, if it has a ``{tag}``; else None.

    Redis hashes the text between the first ``{`` and the first ``}`` after it, when
    that text is not empty.
    """
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]


def companion_key(key: str, suffix: str) -> str:
    """A key for ``suffix`` data that Redis Cluster stores in ``key``'s slot.

    A key with a hash tag (every key of the layout) keeps it: ``p{x}`` ->
    ``p{x}#suffix``, under the same prefix. A key without one (a caller of the
    backend API using its own names) is hashed whole, which ``{key}#suffix``
    reproduces when ``key`` holds no ``}``.
    """
    if hash_tag(key) is not None or "}" in key:
        # With a stray "}" but no tag, no companion can share the slot; such keys
        # only come from callers that bypass the key builder.
        return f"{key}{COMPANION_MARK}{suffix}"
    return f"{{{key}}}{COMPANION_MARK}{suffix}"


@functools.lru_cache(maxsize=4096)  # on every reservation: a funnel's keys recur
def tickets_key(key: str) -> str:
    """Where the reservation tickets of GCRA funnel ``key`` live (a sorted set)."""
    return companion_key(key, TICKETS)


@functools.lru_cache(maxsize=4096)
def ranks_key(key: str) -> str:
    """Where the priority ranks of GCRA funnel ``key``'s tickets live (a hash: ticket
    -> rank, for the tickets a more urgent one may displace)."""
    return companion_key(key, RANKS)


def backlog_key(key: str) -> str:
    """The sorted set of the tasks of funnel ``key`` sent and not yet started (task id
    -> when it stops counting, µs): ``funnel_max_waiting``."""
    return companion_key(key, BACKLOG)


def unique_key(key: str) -> str:
    """The string holding the id of the task that holds unique funnel ``key``
    (``funnel_unique``), expiring with its lease."""
    return companion_key(key, UNIQUE)


def debounce_key(prefix: str, task_name: str, key_part: str = "") -> str:
    """The window of a debounced task's key ("<task id> <first send µs>"), beside the
    parked tasks (one script updates both):
    ``<prefix>{~parked}#debounce:<task>[:<key part>]``."""
    name = _safe_name(task_name)
    name = f"{name}:{key_part}" if key_part else name
    return f"{prefix}{{{PARKED_TAG}}}{COMPANION_MARK}{DEBOUNCE}:{name}"


class ConcurrencyKeys(NamedTuple):
    """The keys of one concurrency funnel, in the order its scripts take them
    (``CONCURRENCY_PARTS``)."""

    leases: str  # task id -> when its lease ends
    info: str  # task id -> who holds its seat; "held:<task id>" -> a held waiter's mark
    waiters: str  # the runs queued for a seat


def concurrency_keys(key: str) -> ConcurrencyKeys:
    """The keys of concurrency funnel ``key``: its leases, their holders' info and its
    waiters, in ``CONCURRENCY_PARTS`` order (the order the concurrency scripts take
    them)."""
    return ConcurrencyKeys(*(companion_key(key, part) for part in CONCURRENCY_PARTS))


def funnel_key(prefix: str, name: str, *parts: str) -> str:
    """``<prefix>{<name>}`` followed by ``:<part>`` for each non-empty part."""
    return f"{prefix}{{{name}}}" + "".join(f":{part}" for part in parts if part)


@lru_cache(maxsize=4096)
def _safe_name(name: str) -> str:
    # idempotent, unlike safe_part: a part made safe already is kept as it is
    return name if _HASHED.fullmatch(name) else safe_part(name)


@functools.lru_cache(maxsize=4096)  # on every decision: a task's keys recur
def task_key(prefix: str, task_name: str, key_part: str = "", index: int | None = None) -> str:
    """The funnel key of a FunnelTask's limit.

    Args:
        prefix: ``funnel_key_prefix``.
        task_name: the task's name (made safe here).
        key_part: what ``funnel_key`` selected (already safe), "" for one funnel.
        index: the limit's position when the task has several limits (they share the
            task's tag, so one script can check them all), None when it has one.
    """
    name = _safe_name(task_name)
    if index is None:
        return funnel_key(prefix, f"{name}:{key_part}" if key_part else name)
    return funnel_key(prefix, name, str(index), key_part)


@functools.lru_cache(maxsize=1024)
def limit_key(prefix: str, pattern: str | None, worker: str = "") -> str:
    """The funnel key of a worker-wide ``funnel_limits`` entry: one per ``pattern``,
    or per ``pattern`` and ``worker`` (a node name) for ``"scope": "worker"``."""
    name = f"{LIMIT_NAME}:{_safe_name(pattern or '*')}"
    return funnel_key(prefix, f"{name}:{_safe_name(worker)}" if worker else name)


PARKED_TAG = "~parked"
PARKED_PARTS = (
    "due", "entries", "claims", "leases", "accepted", "accepted-at", "labels", "counts",
)  # fmt: skip
FAIR_REGISTRY = "fair"  # beside them: the fair-share funnels with waiting tasks
# the companions of a fair-share funnel (_stores.fair): tenants, queue, ids, meta, rates
FAIR_PARTS = (
    "fair", "fair-q", "fair-ids", "fair-meta", "fair-r0", "fair-r1", "fair-r2", "fair-heads",
)  # fmt: skip


def fair_keys(key: str) -> list[str]:
    """The keys of GCRA funnel ``key`` with fair share: the funnel, its tickets, then
    its ``FAIR_PARTS`` companions (one hash slot)."""
    return [key, tickets_key(key), *(companion_key(key, part) for part in FAIR_PARTS)]


class ParkedKeys(NamedTuple):
    """The keys of the parked tasks under one prefix, by name, in ``PARKED_PARTS``
    order (the order ``lua/_parked.lua`` takes them in)."""

    due: str
    entries: str
    claims: str
    leases: str
    accepted: str
    accepted_at: str
    labels: str
    counts: str


def parked_keys(prefix: str) -> ParkedKeys:
    """The keys of the parked tasks under ``prefix``, in ``PARKED_PARTS`` order."""
    return ParkedKeys(*(f"{prefix}{{{PARKED_TAG}}}{COMPANION_MARK}{part}" for part in PARKED_PARTS))


def fair_registry_key(prefix: str) -> str:
    """The fair-share funnels with waiting tasks (``_stores.fair``), beside the parked
    tasks' keys (one hash tag: a script sees them together)."""
    return f"{prefix}{{{PARKED_TAG}}}{COMPANION_MARK}{FAIR_REGISTRY}"


def is_parked_key(prefix: str, key: str | bytes) -> bool:
    """Whether ``key`` is one of the parked tasks' keys under ``prefix`` (a debounced
    key's window among them)."""
    text = key.decode("ascii", "replace") if isinstance(key, bytes) else key
    return (
        text in parked_keys(prefix)
        or text == fair_registry_key(prefix)
        or text.startswith(f"{prefix}{{{PARKED_TAG}}}{COMPANION_MARK}{DEBOUNCE}:")
    )


LIVE_TAG = "~live"


def live_key(prefix: str, part: str) -> str:
    """A key of live operation under ``prefix``: ``overrides``, or ``series:<minute>``."""
    return f"{prefix}{{{LIVE_TAG}}}{COMPANION_MARK}{part}"


HANDED_TAG = "~handed"


def handed_channel(prefix: str, node: str) -> str:
    """The pub/sub channel on which worker ``node`` is told that a waiter it holds was
    handed a seat: ``<prefix>{~handed}#<node>`` (a channel, not a key)."""
    return f"{prefix}{{{HANDED_TAG}}}{COMPANION_MARK}{safe_part(node or 'worker')}"


def handed_worker(channel: str) -> str:
    """The worker (as ``handed_channel`` wrote it) whose channel is ``channel``; "" for
    a channel it did not make."""
    _, tag, node = channel.rpartition(f"{{{HANDED_TAG}}}{COMPANION_MARK}")
    return node if tag else ""


def is_live_key(prefix: str, key: str | bytes) -> bool:
    """Whether ``key`` is one of live operation's keys under ``prefix``."""
    text = key.decode("ascii", "replace") if isinstance(key, bytes) else key
    return text.startswith(live_key(prefix, ""))


def glob_escape(text: str) -> str:
    """``text`` as a literal in a ``SCAN MATCH`` / ``KEYS`` glob (``*?[]\\`` escaped)."""
    return _GLOB.sub(r"\\\1", text)


def scan_pattern(prefix: str, name: str = "") -> str:
    """A ``SCAN MATCH`` pattern for every key of the layout under ``prefix``, or for
    the funnels named ``name`` (and ``name:<...>``) only. Callers still ``parse_key``
    what it returns: the glob is a first cut, the parser the rule."""
    return glob_escape(f"{prefix}{{{name}") + "*"


@dataclass(frozen=True)
class FunnelKey:
    """A key of the layout, taken apart: ``<prefix>{<name>}<rest>[#<companion>]``."""

    key: str
    name: str
    rest: str = ""  # "" or ":<index>[:<key part>]"
    companion: str = ""  # "" for a funnel, else e.g. "tickets"

    @property
    def funnel(self) -> str:
        """The funnel key this key belongs to (itself, for a funnel)."""
        if not self.companion:
            return self.key
        return self.key[: -len(self.companion) - len(COMPANION_MARK)]

    def in_family(self, name: str) -> bool:
        """Whether the funnel is ``name`` or one of its key parts (``name:<part>``)."""
        return self.name == name or self.name.startswith(name + ":")

    def of_task(self, task_name: str, index: int | None = None) -> bool:
        """Whether this key belongs to FunnelTask ``task_name``'s limit ``index``
        (None: the task's only limit)."""
        name = _safe_name(task_name)
        if index is None:
            return not self.rest and self.in_family(name)
        return self.name == name and (self.rest + ":").startswith(f":{index}:")

    def of_limit(self, pattern: str | None) -> bool:
        """Whether this key belongs to the worker-wide limit on ``pattern``."""
        return not self.rest and self.in_family(f"{LIMIT_NAME}:{_safe_name(pattern or '*')}")


# the companions a funnel key may carry: tickets and their ranks, leases, fair-share
# queues, the backlog, a unique key
_COMPANIONS = "|".join((TICKETS, RANKS, *CONCURRENCY_PARTS, BACKLOG, UNIQUE, "fair(?:-[a-z0-9]+)?"))


@lru_cache(maxsize=64)
def _parser(prefix: str) -> re.Pattern[str]:
    return re.compile(
        re.escape(prefix)
        + rf"\{{({_NAME})\}}((?::[0-9]+(?::{_NAME})?)?)"
        + rf"(?:{re.escape(COMPANION_MARK)}({_COMPANIONS}))?"
    )


def parse_key(prefix: str, key: str | bytes) -> FunnelKey | None:
    """``key`` taken apart when it is a key of the layout under ``prefix``, else None
    (a broker queue, a result, another app's key, a foreign key under the prefix)."""
    if isinstance(key, bytes):
        try:
            key = key.decode("ascii")
        except UnicodeDecodeError:
            return None
    match = _parser(prefix).fullmatch(key)
    if match is None or match[1] == PARKED_TAG:  # the parked tasks' keys: not a funnel's
        return None
    return FunnelKey(key, match[1], match[2], match[3] or "")
