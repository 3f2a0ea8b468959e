"""What the gates do when the funnel's Redis fails: which failures are outages
(``configuration_fault`` tells the others apart), the ``funnel_on_backend_error``
policy, the back-off of deferred tasks, and one WARNING per outage (not one per task).

While an outage lasts, a probe thread asks the funnels' Redis every ``PROBE_SECONDS``
whether it answers, and no other call waits on it (``OutageLog.check`` fails at once):
a Redis that hangs (a network cut: every call waits its socket timeout) would
otherwise stall the worker's event loop one timeout per task, and the messages it
holds would outlive what the broker allows them.

Transient (an outage: backed off, or let through, as the policy says): connection
refused or reset, timeouts, LOADING, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, MOVED/ASK
during a resharding, a Sentinel failover. Configuration faults (``BackendConfigurationError``,
never backed off): wrong password or user, NOPERM, READONLY (a replica), OOM,
WRONGTYPE, CROSSSLOT, a command renamed or disabled.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import signals
from .._limiter.backends._faults import configuration_fault
from .._limiter.errors import BackendError, ConfigurationError
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
PROBE_SECONDS = 0.25  # how often the probe asks a failing Redis again


def backoff(attempt: int, cap: float) -> float:
    """Seconds to wait before the ``attempt``-th retry (0-based): 1, 2, 4 … at most
    30 s and at most ``cap``."""
    return float(min(BACKOFF_FIRST_SECONDS * 2 ** min(attempt, 16), BACKOFF_MAX_SECONDS, cap))


class OutageLog:
    """Logs one WARNING when the backend starts failing and one when it answers again,
    per process, whatever the number of tasks in between; sends ``backend_error`` for
    every failure and ``backend_recovered`` once, when it also calls ``on_recovered()``.
    ``down``: the backend is failing. ``probe()``: a call that raises unless the
    backend answers; with one, calls wait no more while it fails (``check``)."""

    def __init__(
        self,
        sender: Any = None,
        on_recovered: Callable[[], None] | None = None,
        probe: Callable[[], Any] | None = None,
    ) -> None:
        self.sender, self.on_recovered, self.probe = sender, on_recovered, probe
        self.down = False
        self._since = 0.0
        self._lock = threading.Lock()
        self._prober: tuple[int, threading.Thread] | None = None  # (pid, thread)

    def check(self) -> None:
        """Return at once while the backend answers, as far as this process knows.

        Raises:
            BackendError: while it fails and a probe watches it (no call waits on it).
        """
        if self.down and self._probing():
            raise BackendError(
                f"the funnels' Redis has not answered for {time.monotonic() - self._since:.1f}"
                f" s (a probe asks it every {PROBE_SECONDS:g} s)"
            )

    def _probing(self) -> bool:
        prober = self._prober
        return prober is not None and prober[0] == os.getpid() and prober[1].is_alive()

    def failed(self, error: BaseException, policy: str) -> None:
        with self._lock:
            first = not self.down
            if first:
                self.down, self._since = True, time.monotonic()
            if self.probe is not None and not self._probing():
                thread = threading.Thread(target=self._watch, name="celery-funnel-probe")
                thread.daemon = True
                self._prober = (os.getpid(), thread)
                thread.start()
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

    def _watch(self) -> None:
        """The probe thread: ask the backend until it answers (or another call saw it
        answer)."""
        assert self.probe is not None
        while self.down:
            try:
                self.probe()
            except Exception:  # still failing: ask again shortly
                time.sleep(PROBE_SECONDS)
                continue
            self.answered()
            return

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
