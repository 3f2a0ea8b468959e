"""Runtime overrides of a funnel's limit: what one is, how it is checked and stored, and
the table a worker decides with.

An override belongs to a funnel *name*, as ``celery funnel status`` names funnels: a
FunnelTask's task name (every limit and key part of that task) or ``limit:<pattern>``
for a worker-wide ``funnel_limits`` entry. It may replace the rate, the capacity and the
concurrency, and it may pause the funnel. It is stored as JSON in one hash per app
prefix (``control``), and every worker keeps a copy (``OverrideTable``) refreshed by its
live thread (``_ops.live``), so that deciding a task costs no extra round trip.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._limiter.errors import ConfigurationError
from .._limiter.limit import Limit
from .._limiter.rate import Rate
from .._limiter.values import MAX_CAPACITY
from .charges import Charge

__all__ = ["Change", "Override", "OverrideTable", "changes", "concurrency_for", "parse_ttl"]

MAX_TTL_SECONDS = 366 * 86400.0
CACHED_LIMITS = 1024
_TTL = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d)?\s*")
_TTL_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_ttl(value: str | float | None) -> float | None:
    """``--ttl``: seconds as a number, or ``"90s"``, ``"30m"``, ``"1h"``, ``"2d"``.

    Raises:
        ConfigurationError: naming the value when it is not one of those, or not
            above 0 and at most a year.
    """
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _TTL.fullmatch(value)):
        seconds = float(match[1]) * _TTL_UNITS[match[2]]
    if seconds is None or not 0 < seconds <= MAX_TTL_SECONDS:
        raise ConfigurationError(
            f"override ttl must be seconds above 0 and at most a year, as a number or"
            f" like '90s', '30m', '1h', '2d'; got {value!r}"
        )
    return seconds


def _count(where: str, value: Any, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ConfigurationError(
            f"override {where} must be an integer from 1 to {high}, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class Override:
    """One funnel's override: ``rate``/``capacity``/``concurrency`` replace the code's
    (None: keep it), ``paused`` stops every start; ``by`` (user@host) set it ``at``
    (epoch seconds); it ends by itself at ``expires_at`` (None: never)."""

    rate: Rate | None = None
    capacity: int | None = None
    concurrency: int | None = None
    paused: bool = False
    by: str = ""
    at: float = 0.0
    expires_at: float | None = None

    @classmethod
    def checked(
        cls, rate: str | float | Rate | None, capacity: Any, concurrency: Any, **fields: Any
    ) -> Override:
        """An override from user input.

        Raises:
            ConfigurationError: naming the rate, capacity or concurrency that is wrong.
        """
        return cls(
            None if rate is None else Rate.parse(rate),
            _count("capacity", capacity, MAX_CAPACITY),
            _count("concurrency", concurrency, MAX_CAPACITY),
            **fields,
        )

    def expired(self, now: float) -> bool:
        """Whether it has ended by itself at ``now`` (epoch seconds)."""
        return self.expires_at is not None and now >= self.expires_at

    @property
    def empty(self) -> bool:
        """Whether it changes nothing (a resumed funnel without other changes)."""
        return not self.paused and (self.rate, self.capacity, self.concurrency) == (None,) * 3

    def as_dict(self) -> dict[str, Any]:
        """Plain values: what the CLI, the dashboard and the stored JSON show."""
        return {
            "rate": None if self.rate is None else str(self.rate),
            "capacity": self.capacity,
            "concurrency": self.concurrency,
            "paused": self.paused,
            "by": self.by,
            "at": self.at,
            "expires_at": self.expires_at,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Override:
        """The inverse of ``to_json``.

        Raises:
            ConfigurationError: when ``text`` is not a stored override.
        """
        try:
            raw = json.loads(text)
            return cls.checked(
                raw.get("rate"), raw.get("capacity"), raw.get("concurrency"),
                paused=bool(raw.get("paused")), by=str(raw.get("by") or ""),
                at=float(raw.get("at") or 0.0),
                expires_at=None if raw.get("expires_at") is None else float(raw["expires_at"]),
            )  # fmt: skip
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigurationError(f"not a stored override: {text!r} ({exc})") from None

    def limit(self, limit: Limit, cost: int = 0) -> Limit:
        """``limit`` with this override's rate and capacity (at least ``cost``: a map's
        batch keeps fitting)."""
        if self.rate is None and self.capacity is None:
            return limit
        capacity = limit.capacity if self.capacity is None else max(self.capacity, cost)
        return dataclasses.replace(limit, rate=self.rate or limit.rate, capacity=capacity)


class Change(NamedTuple):
    """One funnel's override in force before and after a refresh (None: none)."""

    before: Override | None
    after: Override | None

    def _shape(self, side: Override | None) -> tuple[Any, Any]:
        return (None, None) if side is None else (side.rate, side.capacity)

    @property
    def limit(self) -> bool:
        """Whether the rate or capacity in force changed."""
        return self._shape(self.before) != self._shape(self.after)

    @property
    def unpaused(self) -> bool:
        """Whether a pause ended."""
        return bool(self.before and self.before.paused) and not (self.after and self.after.paused)


class OverrideTable:
    """A worker's copy of the app's overrides, replaced whole by its live thread and read
    by the gate (a dict swapped under the GIL: readers never lock)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Override] = {}
        self._limits: dict[tuple[str, int, Limit], Limit] = {}
        self._lock = threading.Lock()
        self.raw: Mapping[bytes | str, bytes | str] = {}

    def load(self, raw: Mapping[bytes | str, bytes | str]) -> None:
        """Replace the table with the stored hash ``raw`` (name -> JSON), when changed;
        an entry that does not parse is skipped (``control`` never writes one)."""
        if raw == self.raw:
            return
        table: dict[str, Override] = {}
        for raw_name, text in raw.items():
            name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
            try:
                table[name] = Override.from_json(text)
            except ConfigurationError:
                continue
        with self._lock:
            self._by_name, self._limits, self.raw = table, {}, dict(raw)

    def get(self, name: str, now: float | None = None) -> Override | None:
        """The live override of funnel ``name`` (None: none, or expired)."""
        found = self._by_name.get(name)
        if found is None or found.expired(time.time() if now is None else now):
            return None
        return found

    def all(self, now: float | None = None) -> dict[str, Override]:
        """Every live override, by funnel name."""
        moment = time.time() if now is None else now
        return {n: o for n, o in self._by_name.items() if not o.expired(moment)}

    def paused(self, charges: Sequence[Charge]) -> str | None:
        """The first paused funnel among ``charges`` (its name), else None."""
        for charge in charges:
            found = self.get(charge.label)
            if found is not None and found.paused:
                return charge.label
        return None

    def apply(self, charges: Sequence[Charge]) -> Sequence[Charge]:
        """``charges`` with every overridden rate and capacity in place (the same list
        when nothing is overridden: the common case costs one dict look-up each)."""
        if not self._by_name:
            return charges
        return [self._apply(charge) for charge in charges]

    def _apply(self, charge: Charge) -> Charge:
        found = self.get(charge.label)
        if found is None:
            return charge
        cache_key = (charge.label, charge.cost, charge.limit)
        limit = self._limits.get(cache_key)
        if limit is None:  # Limit checks itself when built: once per override and limit
            if len(self._limits) > CACHED_LIMITS:  # costs vary per task: keep it bounded
                self._limits.clear()
            limit = self._limits[cache_key] = found.limit(charge.limit, charge.cost)
        return charge if limit is charge.limit else dataclasses.replace(charge, limit=limit)


def changes(before: Mapping[str, Override], after: Mapping[str, Override]) -> dict[str, Change]:
    """The overrides in force that differ between ``before`` and ``after`` (set, ended,
    expired or replaced), by funnel name."""
    names = before.keys() | after.keys()
    return {n: Change(before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)}


def concurrency_for(table: OverrideTable | None, name: str, code: int | None) -> int | None:
    """The concurrency funnel ``name`` runs with: its override's, else ``code`` (the
    task option or ``funnel_limits`` entry). The one place concurrency limits read
    an override from (``_shared.live.live_for(app).overrides`` is the worker's table)."""
    found = None if table is None else table.get(name)
    if found is None or found.concurrency is None:
        return code
    return found.concurrency
