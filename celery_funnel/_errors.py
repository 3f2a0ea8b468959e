"""The exception hierarchy: one root, every class picklable.

Celery moves exceptions between processes (pool children, result backends), so each
class keeps its whole state in ``args`` and unpickles through ``__init__(*args)``.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "ConfigurationError",
    "CostTooHighError",
    "FunnelError",
    "TooManyDeferralsError",
]


class FunnelError(Exception):
    """Root of every error raised by celery-funnel."""


class ConfigurationError(FunnelError, ValueError):
    """A rate, limit, option or setting has a value that cannot work.

    The message names the setting or argument and the value it had.
    """


class BackendError(FunnelError):
    """The funnel's store (Redis) failed or could not be reached.

    Raised ``from`` the underlying client error, which stays available as
    ``__cause__`` in the raising process.
    """


class CostTooHighError(FunnelError):
    """A task's cost is above its funnel's capacity: it can never run, so it fails at
    once instead of being re-queued for ever."""


class TooManyDeferralsError(FunnelError):
    """A task was deferred more than ``funnel_max_deferrals`` times."""
