"""A crash at a named point of the gate, for kill tests: a ``celery worker`` of a test
project started with ``FUNNEL_TEST_DIE_AT="package.module:Class.method"`` SIGKILLs
itself and its pool (its process group) when it first reaches that method, before the
method runs. Nothing is mocked: the worker dies there, as a SIGKILL or a power cut
would end it, and the test watches what the rest of the cluster makes of it."""

from __future__ import annotations

import importlib
import os
import signal
from typing import Any

__all__ = ["arm"]


def arm() -> None:
    """Install the crash ``FUNNEL_TEST_DIE_AT`` names (nothing when it is unset).

    Raises:
        ValueError: when the value does not name a method as ``module:Class.method``.
    """
    where = os.environ.get("FUNNEL_TEST_DIE_AT")
    if not where:
        return
    module, _, attribute = where.partition(":")
    owner, _, method = attribute.partition(".")
    if not (module and owner and method):
        raise ValueError(f"FUNNEL_TEST_DIE_AT={where!r}: expected module:Class.method")
    cls = getattr(importlib.import_module(module), owner)
    getattr(cls, method)  # it exists

    def die(*args: Any, **kwargs: Any) -> None:
        os.killpg(os.getpgrp(), signal.SIGKILL)

    setattr(cls, method, die)
