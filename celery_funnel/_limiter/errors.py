"""The exception hierarchy: one root, every class picklable.

Celery moves exceptions between processes (pool children, result backends), so each
class keeps its whole state in ``args`` and unpickles through ``__init__(*args)``.
"""

from __future__ import annotations

from .words import plural

__all__ = [
    "BackendConfigurationError",
    "BackendError",
    "ConfigurationError",
    "CostTooHighError",
    "FunnelError",
    "Limited",
    "TooManyDeferralsError",
    "TooManyWaitingError",
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
    once instead of being published again for ever."""


class TooManyDeferralsError(FunnelError):
    """A task was deferred more than ``funnel_max_deferrals`` times."""


class TooManyWaitingError(FunnelError):
    """Raised by ``delay``/``apply_async`` of a task with ``funnel_max_waiting=N`` while
    N of its tasks (of its ``funnel_key``) are sent and not yet started: the producer
    should slow down. Nothing was published. A retry, or any send of a task already
    accepted (the gate's own re-publishes and releases), is never refused.

    Attributes:
        waiting: how many tasks of the funnel wait (sent, not started).
        limit: ``funnel_max_waiting`` (N).
        funnel: the funnel's key (per ``funnel_key``).
        task: the task's name.
    """

    def __init__(self, waiting: int, limit: int, funnel: str = "", task: str = "") -> None:
        # the whole state in args: it pickles, and unpickles through __init__
        super().__init__(int(waiting), int(limit), funnel, task)
        self.waiting, self.limit, self.funnel, self.task = int(waiting), int(limit), funnel, task

    def __str__(self) -> str:
        return (
            f"task {self.task!r}: {plural(self.waiting, 'task')} of its funnel"
            f" {self.funnel!r} {'waits' if self.waiting == 1 else 'wait'} to start"
            f" (funnel_max_waiting={self.limit}): send again once"
            f" {'it has' if self.waiting == 1 else 'they have'}"
        )


class BackendConfigurationError(FunnelError):
    """The funnel's Redis answered, but refuses the work as it is configured: wrong
    password or user, a missing ACL permission (NOPERM), a read-only replica, no memory
    left (OOM), a key of the wrong type. Waiting will not fix it, so it is not a
    ``BackendError``: the outage policy (``funnel_on_backend_error``) never backs it
    off, and the task fails at once. The message says what to fix.

    Raised ``from`` the underlying client error (``__cause__``, in the raising process).
    """


class Limited(FunnelError):  # noqa: N818  # the public name: a state, not a fault
    """A funnel refused a call: ``on_limit="raise"``, or a wait longer than ``max_wait``
    (``Funnel.limit``).

    Attributes:
        retry_after: seconds (float) until the same call would be admitted.
        funnel: the funnel's key ("" when not known).
    """

    def __init__(self, retry_after: float, funnel: str = "") -> None:
        # the whole state in args: it pickles, and unpickles through __init__
        super().__init__(float(retry_after), funnel)
        self.retry_after = float(retry_after)
        self.funnel = funnel

    def __str__(self) -> str:
        where = f"funnel {self.funnel!r}" if self.funnel else "the funnel"
        return f"{where} is full: retry after {self.retry_after:.3f} s"


# Users meet these as ``celery_funnel.<name>`` (their public home): tracebacks, Celery's
# stored exceptions and pickle name them so, and find them there.
for _public in (
    FunnelError, ConfigurationError, BackendError, CostTooHighError, TooManyDeferralsError,
    TooManyWaitingError, BackendConfigurationError, Limited,
):  # fmt: skip
    _public.__module__ = "celery_funnel"
