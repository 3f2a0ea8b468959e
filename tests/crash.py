"""A crash at a named point, for kill tests: a ``celery worker`` of a test project
started with ``FUNNEL_TEST_DIE_AT="package.module:Class.method"`` SIGKILLs itself and
its pool (its process group) when it first reaches that method, before the method runs.
With ``FUNNEL_TEST_DIE_IF=copy`` it dies only on a call whose first argument is a
message carrying a copy's token (the ``celery_funnel`` header's ``release``: a copy the
gate published again, or a release); other calls run as they would. Nothing is mocked:
the worker dies there, as a SIGKILL or a power cut would end it, and the test watches
what the rest of the cluster makes of it."""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Callable
from typing import Any

__all__ = ["arm"]


def _is_copy(message: Any) -> bool:
    """Whether ``message`` (kombu's Message, or the payload a transport decoded) is a
    copy the gate published again or released."""
    raw = isinstance(message, dict)
    headers = (message.get("headers") if raw else getattr(message, "headers", None)) or {}
    return bool((headers.get("celery_funnel") or {}).get("release"))


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
    original: Callable[..., Any] = getattr(cls, method)
    only_copies = os.environ.get("FUNNEL_TEST_DIE_IF") == "copy"

    def die(self: Any, *args: Any, **kwargs: Any) -> Any:
        if only_copies and not (args and _is_copy(args[0])):
            return original(self, *args, **kwargs)
        os.killpg(os.getpgrp(), signal.SIGKILL)
        return None

    setattr(cls, method, die)
