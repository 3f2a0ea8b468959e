"""Fair share between tenants of one funnel: the options, and the order of waiting tasks.

``funnel_fair_by`` (a format string over the task's arguments, or a callable taking
them, like ``funnel_key``) names a task's tenant; ``funnel_weights`` (a mapping tenant
-> weight, or a callable taking the tenant; default 1) weighs the tenants. An idle
funnel admits any task at once. Once tasks wait, nothing is admitted at once: every
refused task joins its tenant's queue (parked, with no release time), and the
dispatcher in every worker's releaser hands each free slot to the next tenant by
weighted round-robin (``lua/fair_pop.lua``), the highest Celery priority first within
a tenant (the broker's order: ``rank``), then arrival order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .errors import ConfigurationError
from .strategies._registry import DEFAULT, capabilities
from .values import format_fields

__all__ = ["Fair", "check_fair", "rank", "weight_of"]

RANKS = 256  # priority ranks a queue orders by (0 first)
_ASCENDING = ("redis",)  # transports whose priority 0 is the highest (kombu's Redis)

Label = Callable[[str], str]


class Fair(NamedTuple):
    """A run's share of a fair funnel: its ``tenant`` (a safe key part) and weight."""

    tenant: str
    weight: float = 1.0


def _weight(where: str, tenant: object, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(
            f"{where}: the weight of tenant {tenant!r} must be a number > 0, got {value!r}"
        )
    return float(value)


def check_fair(spec: Mapping[str, Any], where: str, label: Label = str) -> tuple[Any, Any]:
    """The ``fair_by`` and ``weights`` of a limit ``spec``, checked.

    Raises:
        ConfigurationError: naming ``where``, the option and the value.
    """
    fair_by, weights = spec.get("fair_by"), spec.get("weights")
    if fair_by is None:
        if weights is not None:
            raise ConfigurationError(
                f"{where}: {label('weights')}={weights!r} has no effect without {label('fair_by')}"
            )
        return None, None
    if not (isinstance(fair_by, str) or callable(fair_by)):
        raise ConfigurationError(
            f"{where}: {label('fair_by')} must be a format string or a callable, got {fair_by!r}"
        )
    if isinstance(fair_by, str):
        format_fields(f"{where}: {label('fair_by')}", fair_by)
    if not capabilities(spec.get("strategy") or DEFAULT).fair_share:
        raise ConfigurationError(
            f"{where}: {label('fair_by')} needs the 'gcra' strategy, got"
            f" {label('strategy')}={spec.get('strategy')!r}"
        )
    if isinstance(weights, Mapping):
        for tenant, value in weights.items():
            _weight(f"{where}: {label('weights')}", tenant, value)
    elif weights is not None and not callable(weights):
        raise ConfigurationError(
            f"{where}: {label('weights')} must be a mapping tenant -> weight or a"
            f" callable, got {weights!r}"
        )
    return fair_by, weights


def weight_of(weights: Any, tenant: str, where: str = "funnel_weights") -> float:
    """Tenant ``tenant``'s weight under ``weights`` (None: every tenant weighs 1).

    Raises:
        ConfigurationError: when a callable gives no number > 0.
    """
    if weights is None:
        return 1.0
    value = weights(tenant) if callable(weights) else weights.get(tenant, 1)
    return _weight(where, tenant, value)


def rank(transport: str, priority: Any) -> int:
    """A message's place among waiting tasks, 0 first: the broker's priority order, so
    that the same tasks go first with and without the funnel. kombu's Redis transport
    serves 0 first (9 last; no priority counts as 0); AMQP brokers serve the larger
    number first (no priority counts as 0, the lowest)."""
    value = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    value = min(max(value, 0), RANKS - 1)
    return value if transport in _ASCENDING else RANKS - 1 - value
