"""``Loop``: a worker's background thread (the releaser, the live thread): one pass at a
time until stopped, a failing pass reported once and tried again after a pause."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps
from redis.exceptions import RedisError

from .._limiter.errors import BackendError, FunnelError

__all__ = ["Loop", "LoopStep", "log_failure"]

logger = logging.getLogger("celery_funnel")


def log_failure(what: str, error: Exception) -> None:
    """``what`` failed with ``error``, in one line: the funnels' Redis failing (an outage,
    or a refusal such as a read-only replica) at INFO, as the gates and the start check
    report it already; another of the package's errors (a configuration fault names its
    fix) at ERROR. The traceback only under ``-l DEBUG``, or for an error of no known kind
    (a bug)."""
    from_redis = isinstance(error, (BackendError, RedisError))
    level = logging.INFO if from_redis else logging.ERROR
    trace = not (from_redis or isinstance(error, FunnelError)) or logger.isEnabledFor(logging.DEBUG)
    logger.log(
        level, "celery-funnel: %s failed: %s", what, error, exc_info=error if trace else None
    )


class Loop:
    """Runs ``tick()`` (which returns the pause before the next pass, seconds) in a
    daemon thread named ``name`` from ``start()`` until ``stop()``. A pass that raises
    calls ``failed(error)`` the first time in a row and pauses ``error_pause`` seconds;
    the first pass that works after failures calls ``recovered()``."""

    name = "celery-funnel-loop"
    error_pause = 2.0

    def __init__(self) -> None:
        self._stopped = threading.Event()
        self._woken = threading.Event()  # set by stop() and wake(): the pause ends
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopped.set()
        self._woken.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def wake(self) -> None:
        """Run the next pass now instead of at the end of the pause (a funnel resumed:
        its parked tasks are due at once)."""
        self._woken.set()

    def tick(self) -> float:
        raise NotImplementedError

    def failed(self, error: Exception) -> None:
        """The first failure of a row of failing passes."""

    def recovered(self) -> None:
        """A pass worked after failures."""

    def _run(self) -> None:
        pause = 0.0
        while True:
            self._woken.wait(pause)
            if self._stopped.is_set():
                return
            self._woken.clear()
            try:
                pause = self.tick()
            except Exception as exc:  # tried again after a pause
                if not self._failing:
                    self.failed(exc)
                self._failing, pause = True, self.error_pause
            else:
                if self._failing:
                    self.recovered()
                self._failing = False


class LoopStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """A consumer bootstep that runs the ``Loop`` that ``make(consumer)`` returns (None:
    nothing to run) while the consumer runs."""

    label = "celery-funnel loop"
    # started after the gate, so stopped before it: the gate's shutdown closes the
    # funnels' Redis client that the loop uses (a pass after that would reopen it)
    requires = ("celery_funnel._celery.worker:FunnelGate",)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.loop: Loop | None = None

    def make(self, consumer: Any) -> Loop | None:
        raise NotImplementedError

    def start(self, consumer: Any) -> None:
        if self.loop is None:
            self.loop = self.make(consumer)
            if self.loop is not None:
                self.loop.start()

    def stop(self, consumer: Any) -> None:
        if self.loop is not None:
            self.loop.stop()
            self.loop = None

    shutdown = stop
