"""How the worker gate fails a task (``Failing.fail``: as Celery fails one), and the
guard around each of its phases (``Failing.guarded``): whatever a phase raises fails that
one task, and nothing the gate raises reaches Celery's consumer (which would end the
worker)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.state import task_ready

from .._shared.delivery import fail_request
from .held import Held

__all__ = ["Failing"]

logger = logging.getLogger("celery_funnel")


class Failing:
    """Fails the tasks of one worker gate; ``held``: the requests it holds (a request
    failed is held no more)."""

    def __init__(self, held: Held) -> None:
        self.held = held

    def guarded(self, phase: Callable[..., Any], request: Any, *args: Any) -> Any:
        """``phase(request, *args)``: whatever it raises fails that one task, and nothing
        the gate raises reaches Celery's consumer. Should failing it fail too (the
        broker or the result backend gone), the request is forgotten here: the broker
        delivers it again."""
        try:
            return phase(request, *args)
        except Exception as error:
            try:
                return self.fail(request, error, False)
            except Exception:
                logger.exception(
                    "celery-funnel: task %s[%s]: the gate failed, and so did failing the"
                    " task; the broker delivers it again", request.name, request.id,
                )  # fmt: skip
                self.held.forget(request)
                task_ready(request)
                return None

    def fail(self, request: Any, error: BaseException, reported: bool) -> None:
        """Fail ``request`` with ``error`` as Celery fails a task (FAILURE stored,
        errbacks, ``task_failure``, ``task-failed``), ack it, and log one line unless
        the failure was ``reported`` already."""
        if not reported:
            logger.error(
                "celery-funnel: task %s[%s] failed in the gate: %s: %s",
                request.name, request.id, type(error).__name__, error,
            )  # fmt: skip
        self.held.forget(request)
        self.held.backend_of(request)
        fail_request(request, error)
