"""Waiting for state in tests: poll with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 20.0,
    pending: Callable[[], object] | None = None,
) -> None:
    """Return as soon as ``predicate()`` is true; fail after ``timeout`` seconds (a hang),
    saying what was still pending (``pending()``, when given)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            said = "" if pending is None else f": {pending()}"
            raise AssertionError(f"timed out after {timeout} s{said}")
        time.sleep(0.02)
