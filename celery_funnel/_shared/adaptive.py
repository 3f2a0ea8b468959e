"""Adaptive rates (``"adaptive"`` on a limit, ``strategies.adapt``): what a run reports
(a 429, a success) and the table a worker decides with.

The rates live in one hash of the app's live keys (``<prefix>{~live}#adaptive``: funnel
key -> state), holding only the funnels below their code's rate. A run's report is
one script per adaptive funnel, in one round trip (``report``); every worker's live
thread reads the hash with the overrides, about twice a second, into its
``AdaptiveTable``, and the gate decides with it: no extra round trip on the admit
path, and a task with no adaptive funnel below its max costs one empty-dict test.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence

from .._config.runtime import Runtime
from .._limiter.keys import live_key
from .._limiter.limit import Limit
from .._limiter.strategies import capabilities
from .._limiter.strategies._common import emission_us
from .._limiter.strategies.adapt import REFUSED, SUCCEEDED, AdaptOp, rate_of
from .charges import Charge

__all__ = ["AdaptiveTable", "adaptive_key", "report"]

CACHED_LIMITS = 1024


def adaptive_key(prefix: str) -> str:
    """The hash of the adaptive rates under ``prefix``."""
    return live_key(prefix, "adaptive")


class AdaptiveTable:
    """A worker's copy of the adaptive rates below their max (funnel key -> emission
    interval, microseconds per unit), replaced whole by its live thread (a dict swapped
    under the GIL: readers never lock) and updated by this process's own reports."""

    def __init__(self) -> None:
        self._by_key: dict[str, int] = {}
        self._limits: dict[tuple[int, Limit], Limit] = {}
        self._lock = threading.Lock()
        self.raw: Mapping[bytes | str, bytes | str] = {}

    def load(self, raw: Mapping[bytes | str, bytes | str]) -> None:
        """Replace the table with the stored hash ``raw``, when changed."""
        if raw == self.raw:
            return
        table: dict[str, int] = {}
        for name, value in raw.items():
            text = value.decode() if isinstance(value, bytes) else value
            try:
                table[name.decode() if isinstance(name, bytes) else name] = int(text.split()[0])
            except (ValueError, IndexError):
                continue  # adapt.lua never writes one
        with self._lock:
            self._by_key, self.raw = table, dict(raw)

    def put(self, key: str, t_us: int, fast_us: int) -> None:
        """This process reported on funnel ``key``: its rate is ``t_us`` now (at its
        max ``fast_us``: gone from the table)."""
        with self._lock:
            table = dict(self._by_key)
            if t_us <= fast_us:
                table.pop(key, None)
            else:
                table[key] = t_us
            self._by_key = table

    def all(self) -> dict[str, int]:
        """Every funnel key below its max, with its emission interval (microseconds)."""
        return dict(self._by_key)

    def apply(self, charges: Sequence[Charge]) -> Sequence[Charge]:
        """``charges`` with each adaptive funnel's rate in force, when slower than the
        limit's (the same list when no funnel is below its max)."""
        if not self._by_key:
            return charges
        return [self._apply(charge) for charge in charges]

    def _apply(self, charge: Charge) -> Charge:
        t_us = self._by_key.get(charge.key)
        limit = charge.limit
        if t_us is None or limit.adaptive is None:
            return charge
        cached = self._limits.get((t_us, limit))
        if cached is None:
            if emission_us(limit.rate.count, limit.rate.period) >= t_us:
                cached = limit  # an override slower still
            else:
                cached = dataclasses.replace(limit, rate=rate_of(t_us))
            if len(self._limits) > CACHED_LIMITS:
                self._limits.clear()
            self._limits[(t_us, limit)] = cached
        return charge if cached is limit else dataclasses.replace(charge, limit=cached)


def report(
    runtime: Runtime, charges: Sequence[Charge], refused: bool, table: AdaptiveTable
) -> dict[str, float]:
    """Record a refusal (429) or a success on every adaptive GCRA funnel of ``charges``
    (the code's limits: their rate is the max), in one round trip; ``table`` takes the
    new rates at once. The rates in force, units per second, by funnel key.

    Raises:
        BackendError: when the funnels' Redis fails.
    """
    adaptive = [
        (c, c.limit.adaptive) for c in charges
        if c.limit.adaptive is not None and capabilities(c.limit.strategy).adapts
    ]  # fmt: skip
    if not adaptive:
        return {}
    key, event = adaptive_key(runtime.settings.key_prefix), REFUSED if refused else SUCCEEDED
    ops = [AdaptOp(key, c.key, spec, c.limit.rate, event) for c, spec in adaptive]
    rates: dict[str, float] = {}
    for (charge, _), (t_us, _) in zip(adaptive, runtime.funnel.decide(ops), strict=True):
        rate = charge.limit.rate
        table.put(charge.key, t_us, emission_us(rate.count, rate.period))
        rates[charge.key] = 1_000_000 / t_us
    return rates
