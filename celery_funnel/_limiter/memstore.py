"""A tiny in-process stand-in for the few Redis commands the scripts use.

It exists so that each Lua script's Python twin reads like the script: same commands,
same arguments. Values are strings, as in Redis; expiry is checked against the clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

Clock = Callable[[], float]
_Value = str | dict[str, str] | dict[str, int]


class MemoryStore:
    """Strings, hashes and sorted sets (integer scores) with millisecond expiry."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or time.time
        self._data: dict[str, _Value] = {}
        self._expires: dict[str, int] = {}

    def time_us(self) -> int:
        """The store's clock in integer microseconds (Redis ``TIME``)."""
        return math.floor(self._clock() * 1_000_000)

    def _live(self, key: str) -> _Value | None:
        deadline = self._expires.get(key)
        if deadline is not None and deadline <= self.time_us():
            self.delete(key)
        value = self._data.get(key)
        if isinstance(value, dict) and not value:
            # Redis drops a hash or sorted set with its last member.
            self.delete(key)
            return None
        return value

    def delete(self, *keys: str) -> int:
        """Remove keys; how many existed."""
        gone = 0
        for key in keys:
            self._expires.pop(key, None)
            gone += self._data.pop(key, None) is not None
        return gone

    def keys(self) -> list[str]:
        """Every live key."""
        return [key for key in list(self._data) if self._live(key) is not None]

    def pexpire(self, key: str, ms: int) -> None:
        if key in self._data:
            self._expires[key] = self.time_us() + ms * 1000

    def pttl(self, key: str) -> int:
        if self._live(key) is None:
            return -2
        deadline = self._expires.get(key)
        return -1 if deadline is None else math.ceil((deadline - self.time_us()) / 1000)

    def get(self, key: str) -> str | None:
        value = self._live(key)
        return value if isinstance(value, str) else None

    def set_px(self, key: str, value: str, ms: int) -> None:
        self._data[key] = value
        self.pexpire(key, ms)

    def _hash(self, key: str) -> dict[str, str]:
        value = self._live(key)
        if value is None:
            value = self._data[key] = {}
        return value  # type: ignore[return-value]

    def hmget(self, key: str, fields: Sequence[str]) -> list[str | None]:
        value = self._live(key)
        return [value.get(f) if isinstance(value, dict) else None for f in fields]  # type: ignore[misc]

    def hgetall(self, key: str) -> dict[str, str]:
        value = self._live(key)
        return dict(value) if isinstance(value, dict) else {}  # type: ignore[arg-type]

    def hset(self, key: str, mapping: dict[str, str]) -> None:
        self._hash(key).update(mapping)

    def hdel(self, key: str, fields: Sequence[str]) -> None:
        value = self._live(key)
        if isinstance(value, dict):
            for f in fields:
                value.pop(f, None)

    def _zset(self, key: str) -> dict[str, int]:
        value = self._live(key)
        if value is None:
            value = self._data[key] = {}
        return value  # type: ignore[return-value]

    def zadd(self, key: str, members: dict[str, int]) -> None:
        self._zset(key).update(members)

    def zscore(self, key: str, member: str) -> int | None:
        return self._zset(key).get(member)

    def zrem(self, key: str, member: str) -> None:
        self._zset(key).pop(member, None)

    def zcard(self, key: str) -> int:
        return len(self._zset(key))

    def zcount(self, key: str, low: int, high: int) -> int:
        return sum(low <= s <= high for s in self._zset(key).values())

    def zremrangebyscore(
        self, key: str, high: int, *, inclusive: bool = True, count: int | None = None
    ) -> list[str]:
        """Remove members scored ``<= high`` (``< high`` when not inclusive); only the
        ``count`` lowest of them when given (ZCOUNT + ZREMRANGEBYRANK). The members
        removed."""
        zset = self._zset(key)
        doomed = sorted(
            (score, member)
            for member, score in zset.items()
            if score < high or (inclusive and score == high)
        )
        for _, member in doomed[:count]:
            del zset[member]
        return [member for _, member in doomed[:count]]

    def zrange_above(self, key: str, low: int, count: int) -> list[tuple[str, int]]:
        """The ``count`` first (member, score) scored above ``low``, by score then
        member (ZRANGEBYSCORE (low +inf WITHSCORES LIMIT 0 count)."""
        found = sorted((s, m) for m, s in self._zset(key).items() if s > low)
        return [(m, s) for s, m in found[:count]]

    def zscores(self, key: str) -> list[int]:
        """Every score in ascending order (what ZRANGE ... WITHSCORES walks)."""
        return sorted(self._zset(key).values())
