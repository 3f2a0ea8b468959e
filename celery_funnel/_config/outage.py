"""What the gates do when the funnel's Redis fails: which failures are outages
(``configuration_fault`` tells the others apart), the ``funnel_on_backend_error``
policy, the back-off of deferred tasks, and one WARNING per outage (not one per task).

Transient (an outage: backed off, or let through, as the policy says): connection
refused or reset, timeouts, LOADING, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, MOVED/ASK
during a resharding, a Sentinel failover. Configuration faults (``BackendConfigurationError``,
never backed off): wrong password or user, NOPERM, READONLY (a replica), OOM,
WRONGTYPE, CROSSSLOT, a command renamed or disabled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import signals
from .._limiter.backends._faults import configuration_fault
from .._limiter.errors import ConfigurationError
from .._limiter.values import did_you_mean

__all__ = ["POLICIES", "OutageLog", "backoff", "check_policy", "configuration_fault"]

logger = logging.getLogger("celery_funnel")

POLICIES = ("defer", "allow", "raise")


def check_policy(name: str, value: Any) -> str:
    """A ``funnel_on_backend_error`` value, checked."""
    if value not in POLICIES:
        hint = did_you_mean(value, POLICIES) if isinstance(value, str) else ""
        raise ConfigurationError(f"{name} must be one of {list(POLICIES)}, got {value!r}{hint}")
    return str(value)


BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0


def backoff(attempt: int, cap: float) -> float:
    """Seconds to wait before the ``attempt``-th retry (0-based): 1, 2, 4 … at most
    30 s and at most ``cap``."""
    return float(min(BACKOFF_FIRST_SECONDS * 2 ** min(attempt, 16), BACKOFF_MAX_SECONDS, cap))


class OutageLog:
    """Logs one WARNING when the backend starts failing and one when it answers again,
    per process, whatever the number of tasks in between; sends ``backend_error`` for
    every failure and ``backend_recovered`` once, when it also calls ``on_recovered()``.
    ``down``: the backend is failing."""

    def __init__(self, sender: Any = None, on_recovered: Callable[[], None] | None = None) -> None:
        self.sender, self.on_recovered = sender, on_recovered
        self.down = False
        self._since = 0.0
        self._lock = threading.Lock()

    def failed(self, error: BaseException, policy: str) -> None:
        with self._lock:
            first = not self.down
            if first:
                self.down, self._since = True, time.monotonic()
        signals.backend_error.send(sender=self.sender, error=error, policy=policy, first=first)
        if first:
            logger.warning(
                "celery-funnel: the funnel backend failed (%s); tasks are now handled by"
                " funnel_on_backend_error=%r until it answers again: check that the Redis of"
                " funnel_redis_url is up and reachable",
                error,
                policy,
                extra={"celery_funnel": {"event": "backend_error", "policy": policy}},
            )

    def answered(self) -> None:
        if not self.down:  # the common case: no lock on the hot path
            return
        with self._lock:
            if not self.down:
                return
            self.down = False
            downtime = time.monotonic() - self._since
        signals.backend_recovered.send(sender=self.sender, downtime=downtime)
        if self.on_recovered is not None:
            self.on_recovered()
        logger.warning(
            "celery-funnel: the funnel backend answers again after %.1f s",
            downtime,
            extra={"celery_funnel": {"event": "backend_recovered", "downtime": downtime}},
        )
