"""Concurrency seats as leases in the funnels' Redis (``lua/concurrency_*.lua``).

A seat is a lease: the task id in a sorted set beside its funnel's key (``#leases``,
score = when the lease ends), with who holds it (``#lease-info``: token, worker, start).
The worker gate takes every seat a task needs in one atomic call, before the task
reaches the pool; the run gives them back when it ends, by task id and token (twice is
harmless); the worker renews the leases it holds in one call per interval; a lease not
renewed (its worker died) runs out, and the next script that touches the funnel frees
it. A task refused a seat waits queued (``#waiters``: the broker's priority first, then
arrival), parked (``_stores.park``) with no release time, or, where nothing may be
parked, held in its worker (a held waiter, ``HeldWaiter``): a freed seat is handed to
the first waiter in the same script; the process that freed it publishes a parked
waiter at once (``hand_on``), and the script itself tells a held waiter's worker on
its pub/sub channel. A held waiter's mark lasts a few seconds unless its worker looks
again: a dead worker's waiters leave the queue, and a seat handed to one runs out
with its mark.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from .._limiter.concurrency import SEATS
from .._limiter.errors import BackendError
from .._limiter.keys import concurrency_keys, handed_worker, parked_keys
from .._limiter.scripts import RedisClient, run_script
from .park import Release, decode_message
from .store import RedisStore, text

__all__ = [
    "ConcurrencyFunnel",
    "ConcurrencyStore",
    "Handed",
    "HeldWaiter",
    "Holder",
    "Lease",
    "Renewed",
]  # fmt: skip

logger = logging.getLogger("celery_funnel")
US = 1_000_000


@dataclass(frozen=True)
class ConcurrencyFunnel:
    """One concurrency funnel a run needs a seat in: at most ``n`` at once on ``key``
    (its funnel key; the lease keys are beside it); ``label`` names it; ``variant``
    (not part of what it is: two funnels on one key are one) takes its seats
    (``_gate.concurrency``)."""

    n: int
    key: str
    label: str
    variant: str = field(default=SEATS, compare=False)


@dataclass(frozen=True)
class HeldWaiter:
    """A run refused a seat and held in its worker (not parked): queued with priority
    ``rank`` (0 first), told on ``channel`` (its worker's, ``handed_channel``) when
    handed a seat; its mark ``lasts`` seconds unless it looks again (then, its worker
    died: it leaves the queue)."""

    channel: str
    lasts: float
    rank: int = 0


Handed = tuple[ConcurrencyFunnel, str]  # a waiter (task id) handed a seat of a funnel


@dataclass(frozen=True)
class Lease:
    """The seats one run of task ``task_id`` holds under ``token``."""

    task_id: str
    token: str
    funnels: tuple[ConcurrencyFunnel, ...]


@dataclass(frozen=True)
class Holder:
    """One seat of a funnel, as ``celery funnel status`` shows it: held by a run of
    ``task_id`` (``token``) on ``worker`` since ``started``, or handed to a waiter
    (``token`` ""): a parked one, or one held by worker ``held_by``; the lease ends at
    ``expires`` (epoch seconds)."""

    task_id: str
    token: str
    worker: str
    started: float | None
    expires: float
    held_by: str = ""


@dataclass(frozen=True)
class Renewed:
    """What one renewal call found: leases no longer held (``gone``: funnel key, task
    id), funnels with nothing held nor queued (``empty``), waiters handed a seat."""

    gone: list[tuple[str, str]]
    empty: list[str]
    promoted: list[Handed]


def _handed(funnels: Sequence[ConcurrencyFunnel], items: Iterable[Any]) -> list[Handed]:
    """The waiters a script handed seats, from its "<funnel index>:<task id>" items."""
    pairs = (text(item).split(":", 1) for item in items)
    return [(funnels[int(index) - 1], task_id) for index, task_id in pairs]


def _keys_and_counts(funnels: Sequence[ConcurrencyFunnel]) -> tuple[list[str], list[int]]:
    keys = [key for funnel in funnels for key in concurrency_keys(funnel.key)]
    return keys, [funnel.n for funnel in funnels]


class ConcurrencyStore(RedisStore):
    """The concurrency seats of one app in the funnels' Redis (``client``, redis-py),
    with leases of ``ttl`` seconds; parked waiters live in the parked index under
    ``prefix``.

    Raises (every method): ``BackendError`` when Redis fails.
    """

    what = "the concurrency seats"

    def __init__(self, client: RedisClient, prefix: str, ttl: float) -> None:
        super().__init__(client)
        self.ttl, self.ttl_us = ttl, round(ttl * US)
        self.parked = parked_keys(prefix)
        self._take, self._queue, self._free, self._renew = (
            self._register("_concurrency", name)
            for name in (
                "concurrency_take",
                "concurrency_queue",
                "concurrency_free",
                "concurrency_renew",
            )
        )
        self._wake = self._register("_parked", "concurrency_wake")

    def take(
        self, funnels: Sequence[ConcurrencyFunnel], task_id: str, worker: str, token: str = "",
        held: HeldWaiter | None = None,
    ) -> tuple[Lease | None, list[Handed]]:  # fmt: skip
        """Take a seat in every one of ``funnels`` for ``task_id``, all or none, under
        ``token`` (a new one when ""): the lease (None: refused, nothing taken) and the
        parked waiters this call handed a seat. Refused, a run ``held`` in its worker is
        queued as a held waiter (its place kept from its first refusal)."""
        token = token or uuid.uuid4().hex
        keys, counts = _keys_and_counts(funnels)
        mark = held or HeldWaiter("", 0.0)
        reply = self._script(
            self._take, keys, task_id, f"{token}|{worker}", self.ttl_us,
            mark.channel, round(mark.lasts * US), mark.rank, *counts,
        )  # fmt: skip
        lease = Lease(task_id, token, tuple(funnels)) if int(reply[0]) else None
        return lease, _handed(funnels, reply[2:])

    def queue(
        self, funnels: Sequence[ConcurrencyFunnel], task_id: str, rank: int = 0
    ) -> list[Handed]:
        """Queue parked ``task_id`` for a seat in ``funnels``, behind the waiters of its
        priority ``rank`` (0 first, 0..255) and ahead of less urgent ones; the waiters
        handed a seat."""
        keys, counts = _keys_and_counts(funnels)
        args = (task_id, self.ttl_us, rank, *counts)
        return _handed(funnels, self._script(self._queue, keys, *args))

    def free(
        self, funnels: Sequence[ConcurrencyFunnel], task_id: str, token: str
    ) -> tuple[int, list[Handed]]:
        """Give back the seats ``task_id`` holds under ``token`` ("": a seat handed to
        it while parked, and its place in the queue; "*": whatever holds them). How
        many were given back, and the waiters handed them."""
        keys, counts = _keys_and_counts(funnels)
        reply = self._script(self._free, keys, task_id, token, self.ttl_us, *counts)
        return int(reply[0]), _handed(funnels, reply[1:])

    def renew(
        self, funnels: Sequence[ConcurrencyFunnel], held: dict[str, list[tuple[str, str]]]
    ) -> Renewed:
        """Renew the leases ``held`` (funnel key -> [(task id, token)]) in one call, and
        sweep every one of ``funnels`` for leases that ran out."""
        keys, args = _keys_and_counts(funnels)[0], [str(self.ttl_us)]
        for funnel in funnels:
            pairs = held.get(funnel.key, [])
            args += [
                str(funnel.n),
                str(len(pairs)),
                *(item for pair in pairs for item in pair),
            ]
        reply = [text(item) for item in self._script(self._renew, keys, *args)]
        count = int(reply[0])
        gone = []
        for item in reply[1 : 1 + count]:
            index, task_id = item.split(":", 1)
            gone.append((funnels[int(index) - 1].key, task_id))
        at = 1 + count
        empties = int(reply[at])
        empty = [funnels[int(i) - 1].key for i in reply[at + 1 : at + 1 + empties]]
        return Renewed(gone, empty, _handed(funnels, reply[at + 1 + empties :]))

    def wake(self, task_ids: Iterable[str], lease: float) -> tuple[list[str], list[Release]]:
        """Claim the parked waiters ``task_ids`` for release now (``lease`` seconds to
        publish them): the ids no longer parked, and the claims to publish."""
        token = uuid.uuid4().hex
        args = [round(lease * US), token, *task_ids]
        try:
            reply = run_script(self.client, self._wake, self.parked, args)
        except RedisError as exc:
            raise BackendError(f"Redis failed on the parked tasks: {exc}") from exc
        count = int(reply[0])
        missing = [text(i) for i in reply[1 : 1 + count]]
        rest = reply[1 + count :]
        pairs = zip(rest[0::2], rest[1::2], strict=True)
        return missing, [Release(text(i), token, decode_message(m)) for i, m in pairs]

    def holders(self, key: str) -> list[Holder]:
        """Who holds the seats of concurrency funnel ``key``, oldest lease end first."""
        leases, info, _ = concurrency_keys(key)
        pairs = self._method("zrange", leases, 0, -1, withscores=True)
        ids = [text(i) for i, _ in pairs]
        # a seat handed to a held waiter keeps its mark ("<channel>|<until>") until taken
        fields = [*ids, *(f"held:{i}" for i in ids)]
        values = self._method("hmget", info, fields) if pairs else []
        ends_at = [float(ends) / US for _, ends in pairs]
        found = []
        for task_id, ends, value, mark in zip(
            ids, ends_at, values[: len(ids)], values[len(ids) :], strict=True
        ):
            token, _, rest = text(value or "").partition("|")
            worker, _, started = rest.rpartition("|")
            begun = int(started) / US if started.isdigit() else None
            held_by = handed_worker(text(mark).rpartition("|")[0]) if mark and not value else ""
            found.append(Holder(task_id, token, worker, begun, ends, held_by))
        return found

    def waiting(self, key: str) -> int:
        """How many parked tasks wait for a seat of concurrency funnel ``key``."""
        return int(self._method("zcard", concurrency_keys(key).waiters))
