"""The fair-share funnels' state in Redis: the waiting queues (``lua/fair_*.lua``, under
each funnel's hash tag) and their side among the parked tasks (``lua/park_fair.lua``,
under ``{~parked}``).

A tenant's state lives while it has tasks waiting: its pass (virtual time), its weight
and its queue entries go when its last waiting task is handed a slot; a funnel's
virtual time and sequence go when no tenant waits. Per waiting task: one member of the
queue sorted set and one field of the ids hash; per waiting tenant: one member of the
tenants sorted set (and a weight field when not 1). Admission counts live 4 s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from redis.exceptions import RedisError

from .._limiter.errors import BackendError
from .._limiter.fair import Fair
from .._limiter.keys import fair_keys, fair_registry_key, parked_keys
from .._limiter.scripts import RedisClient
from .store import RedisStore, text

__all__ = ["FairStore", "Popped", "TenantRow", "fair_status"]

US = 1_000_000
HEADS = 50  # tenants a status lists per funnel, the next to be served first
ENLISTED = 10_000  # fair funnels a purge looks through
PAGE = 1000


class Popped(NamedTuple):
    """What one dispatch of a funnel booked: ``slots`` (task id, slot µs), at ``now`` µs
    (server time), and how many ``tenants`` still wait."""

    tenants: int
    now: int
    slots: list[tuple[str, int]]


class TenantRow(NamedTuple):
    """One tenant of a fair funnel, as ``status`` shows it."""

    tenant: str
    waiting: int
    admitted_per_second: int


def fair_status(client: RedisClient, key: str) -> list[TenantRow]:
    """Per tenant of fair funnel ``key`` (redis-py ``client``): tasks waiting and tasks
    admitted in the last whole second (the server's clock), the next served first; then
    the tenants admitted in that second with nothing waiting now. At most ``HEADS``
    waiting tenants are listed. The hook ``celery funnel status`` and the dashboard read.

    Raises:
        RedisError: when Redis fails.
    """
    keys = fair_keys(key)
    tenants = [text(t) for t in client.zrange(keys[2], 0, HEADS - 1)]
    second = int(client.time()[0]) - 1
    counts = {text(k): int(v) for k, v in client.hgetall(keys[6 + second % 3]).items()}
    if counts.pop("@", None) != second:
        counts = {}
    queue = keys[3]
    rows = [
        TenantRow(t, int(client.zlexcount(queue, f"[{t}\0", f"({t}\1")), counts.pop(t, 0))
        for t in tenants
    ]
    rows.extend(TenantRow(t, 0, n) for t, n in sorted(counts.items()))
    return rows


class FairStore(RedisStore):
    """The fair-share state of one app's funnels in ``client`` (redis-py), under
    ``prefix`` (``funnel_key_prefix``).

    Raises (every method): ``BackendError`` when Redis fails.
    """

    what = "a fair-share funnel"

    def __init__(self, client: RedisClient, prefix: str) -> None:
        super().__init__(client)
        self.parked = [*parked_keys(prefix), fair_registry_key(prefix)]
        self._admit, self._enqueue, self._pop, self._forget = (
            self._register("_clock", "_fair", name)
            for name in ("fair_admit", "fair_enqueue", "fair_pop", "fair_forget")
        )
        self._park = self._register("_parked", "park_fair")

    def admit(
        self, key: str, task_id: str, shape: tuple[int, int], grace: tuple[int, int], tenant: str
    ) -> tuple[int, int]:
        """The gate's admission on fair funnel ``key`` (``fair_admit.lua``): ``shape`` is
        (increment, tau) µs, ``grace`` (early, late) µs. Returns (status, delay µs)."""
        reply = self._script(self._admit, fair_keys(key), "", task_id, *shape, *grace, tenant)
        return int(reply[0]), int(reply[1])

    def enqueue(
        self, key: str, task_id: str, fair: Fair, order: tuple[int, bool], cost: int,
        shape: tuple[int, int],
    ) -> bool:  # fmt: skip
        """``task_id`` joins ``fair.tenant``'s queue; ``order``: (priority rank, in
        front); ``shape``: (T, tau) µs. False when it waits there already."""
        weight = f"{fair.weight:.17g}"
        rank, front = order
        args = (task_id, fair.tenant, weight, rank, cost, int(front), *shape)
        return bool(self._script(self._enqueue, fair_keys(key), *args)[0])

    def pop(self, key: str, horizon: float, limit: int, late: float) -> Popped:
        """Book the next free slots of fair funnel ``key`` up to ``horizon`` seconds
        ahead for at most ``limit`` waiting tasks (``fair_pop.lua``)."""
        args = ("", round(horizon * US), limit, round(late * US))
        reply = self._script(self._pop, fair_keys(key), *args)
        pairs = zip(reply[2::2], reply[3::2], strict=True)
        return Popped(int(reply[0]), int(reply[1]), [(text(i), int(s)) for i, s in pairs])

    def forget(self, ids: Sequence[str]) -> int:
        """Take tasks that no longer wait parked (purged, released by hand) out of the
        queues of every fair funnel with waiting tasks. How many were queued."""
        if not ids:
            return 0
        return sum(
            int(self._script(self._forget, fair_keys(key), *ids)[0])
            for key in self.enlisted(ENLISTED)
        )

    def due(self, slots: Sequence[tuple[str, int]]) -> list[str]:
        """Make each waiting parked task due at its slot; the ids that no longer wait."""
        args = [value for pair in slots for value in pair]
        return [text(i) for i in self._script(self._park, self.parked, "due", *args)]

    def enlist(self, key: str) -> None:
        """Fair funnel ``key`` has waiting tasks: the dispatchers serve it."""
        self._script(self._park, self.parked, "enlist", key)

    def delist(self, key: str, age: float) -> bool:
        """Stop serving ``key`` (seen with no waiting task) unless a task joined its
        queue within ``age`` seconds."""
        return bool(self._script(self._park, self.parked, "delist", key, round(age * US))[0])

    def enlisted(self, limit: int, offset: int = 0) -> list[str]:
        """Up to ``limit`` fair funnels with waiting tasks, from the ``offset``-th."""
        found = self._method("zrange", self.parked[-1], offset, offset + limit - 1)
        return [text(k) for k in found]

    def status(self, key: str) -> list[TenantRow]:
        """See ``fair_status``."""
        try:
            return fair_status(self.client, key)
        except RedisError as exc:
            raise BackendError(f"Redis failed on a fair-share funnel: {exc}") from exc
