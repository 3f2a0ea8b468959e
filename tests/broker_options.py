"""The Redis transport options of the test apps whose broker's Redis a test kills or
whose messages wait past the visibility timeout."""

from __future__ import annotations

from typing import Any

__all__ = ["restore_options"]


def restore_options(visibility: float) -> dict[str, Any]:
    """kombu's Redis transport options for a ``visibility`` seconds timeout: scan for
    messages past it every second, not every 100 s; and the lock each scan takes
    (``unacked_mutex``), which outlives a broker killed while a worker held it (AOF
    keeps it) and stops every restore until it expires (300 s by default), expires
    with the visibility timeout."""
    return {
        "visibility_timeout": visibility,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": visibility,
    }
