"""The keys of unique tasks (``funnel_unique``): one string beside the task's funnel
(``<funnel key>#unique``) holding the id of the task that waits or runs for that key.

A producer takes the key before it publishes (``claim``); a send that finds it held by
another task publishes nothing. The key lasts ``ttl`` seconds from the send, and the
worker running the task renews it (``renew``), so a task that dies with its worker frees
its key ``ttl`` seconds later at the latest; the run's end frees it at once (``free``,
only by the task that holds it).
"""

from __future__ import annotations

from collections.abc import Sequence

from .._limiter.keys import unique_key
from .._limiter.scripts import RedisClient
from .store import RedisStore, text

__all__ = ["UniqueStore"]


class UniqueStore(RedisStore):
    """The unique keys in the funnels' Redis (``client``, redis-py).

    Raises (every method): ``BackendError`` when Redis fails.
    """

    what = "the unique tasks"

    def __init__(self, client: RedisClient) -> None:
        super().__init__(client)
        self._claim = self._register("unique_claim")
        self._renew = self._register("unique_renew")
        self._free = self._register("unique_free")

    def claim(self, funnel: str, task_id: str, ttl: float, over: str = "") -> tuple[bool, str]:
        """Take funnel ``funnel``'s unique key for ``task_id`` for ``ttl`` seconds (also
        from task ``over``, whose run ended): whether this task holds it now, and the
        id of the task that holds it."""
        reply = self._script(self._claim, [unique_key(funnel)], task_id, _ms(ttl), over)
        return bool(int(reply[0])), text(reply[1])

    def renew(self, held: Sequence[tuple[str, str]], ttl: float) -> list[int]:
        """Renew the keys ``held`` ((funnel, task id) pairs, all in one hash slot on a
        Cluster) for ``ttl`` seconds: the indexes of those no longer held."""
        keys = [unique_key(funnel) for funnel, _ in held]
        reply = self._script(self._renew, keys, _ms(ttl), *(task_id for _, task_id in held))
        return [int(i) - 1 for i in reply]

    def free(self, funnel: str, task_id: str) -> bool:
        """Free funnel ``funnel``'s unique key if ``task_id`` holds it."""
        return bool(int(self._script(self._free, [unique_key(funnel)], task_id)[0]))

    def holder(self, funnel: str) -> tuple[str, float] | None:
        """The task holding funnel ``funnel``'s key and the seconds its claim has left
        (None when free)."""
        key = unique_key(funnel)
        holder = self._method("get", key)
        if holder is None:
            return None
        return text(holder), max(int(self._method("pttl", key)), 0) / 1000


def _ms(seconds: float) -> int:
    return max(round(seconds * 1000), 1)
