"""Concurrency limits: at most ``n`` runs of a task at once, across every worker.

Two ways to ask for one: the task option ``funnel_concurrency=N`` (per key with
``funnel_key``: ``n`` at once per key), and ``"concurrency": N`` in an entry of the
``funnel_limits`` setting (alone, or beside a ``rate`` in the same entry), with
``"scope": "global"`` (one count for the cluster) or ``"worker"`` (one per worker).
This module reads and checks them; ``_stores.concurrency`` keeps the seats,
``_gate.concurrency`` takes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError
from .values import MAX_CAPACITY

__all__ = ["SEATS", "ConcurrencyLimit", "check_concurrency", "split_entry"]

OPTION = "concurrency"
SCOPES = ("global", "worker")
VARIANT = "variant"  # an entry's key naming the variant that takes its seats
SEATS = "seats"  # the built-in variant: at most N runs at once (``_gate.concurrency``)


@dataclass(frozen=True)
class ConcurrencyLimit:
    """At most ``n`` at once: of the tasks matching ``pattern`` (a ``funnel_limits``
    entry, counted per worker with ``scope`` "worker"), or of one FunnelTask (``pattern``
    None; split by its ``funnel_key``)."""

    n: int
    pattern: str | None = None
    scope: str = "global"
    variant: str = SEATS  # how its seats are taken, started, freed and waited for


def check_concurrency(where: str, value: Any) -> int:
    """A concurrency value, checked: an integer from 1 to ``MAX_CAPACITY``.

    Raises:
        ConfigurationError: naming ``where`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CAPACITY:
        raise ConfigurationError(
            f"{where} must be an integer from 1 to {MAX_CAPACITY:_} (tasks running at once),"
            f" got {value!r}"
        )
    return value


def split_entry(pattern: str, spec: Any) -> tuple[Any, ConcurrencyLimit | None]:
    """A ``funnel_limits`` entry taken apart: what is left for a rate limit (None when the
    entry has no rate) and its concurrency limit (None when it has none).

    Raises:
        ConfigurationError: naming the entry, the option and the value.
    """
    if not isinstance(spec, Mapping) or OPTION not in spec:
        return spec, None
    where = f"funnel_limits[{pattern!r}]"
    n = check_concurrency(f"{where}: 'concurrency'", spec[OPTION])
    scope = spec.get("scope", "global")
    if scope not in SCOPES:
        raise ConfigurationError(f"{where}: scope must be one of {list(SCOPES)}, got {scope!r}")
    variant = spec.get(VARIANT, SEATS)
    if not isinstance(variant, str) or not variant:
        raise ConfigurationError(f"{where}: 'variant' must be a variant's name, got {variant!r}")
    rest = {name: value for name, value in spec.items() if name not in (OPTION, VARIANT)}
    if "rate" in rest:
        return rest, ConcurrencyLimit(n, pattern, scope, variant)
    extra = sorted(set(rest) - {"scope"})
    if extra:
        raise ConfigurationError(
            f"{where}: {extra} need a 'rate' in the same entry; a concurrency limit"
            f" alone takes 'concurrency', 'scope' and 'variant'"
        )
    return None, ConcurrencyLimit(n, pattern, scope, variant)
