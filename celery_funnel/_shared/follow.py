"""Followers of unique tasks: a send of a unique task (``funnel_unique``) inside a
canvas (a chain, a link or errback, a group or a chord) whose key another task holds
is published as a task of its own that *follows* the holder (the ``celery_funnel_follows``
header names it): it runs no body of its own, waits until the holder's run ends, then
completes with the holder's outcome (its return value, or its exception), so that
Celery carries its canvas on as if it had run. A holder that ended without an outcome
(revoked, never run, a result nobody stored) leaves its key to the follower, which then
runs its own body. A key is never run by two bodies at once.

The gate checks a follower on each pass (``Follow.next``): while the holder keeps the
key it waits (held, parked or published again, as any wait), polled at growing
intervals; once the holder's outcome is stored, the request is handed to the pool as
``celery_funnel.follow`` (``FOLLOW_TASK``, registered by ``install``), whose run
returns that outcome under the follower's own id and message (chain, callbacks, group
and chord membership). A plain send whose key is held still publishes nothing and
returns the holder's ``AsyncResult`` (``_celery.unique``).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from celery import states

from .._config.dedupe import Unique
from .._config.options import unique_of
from .._config.runtime import Runtime, runtime_for
from .._limiter.limit import key_part
from .judge import Ruling
from .state import State

__all__ = [
    "FOLLOWS", "FOLLOW_TASK", "Follow", "Next", "ended", "follows_of", "in_canvas",
    "unique_funnel",
]  # fmt: skip

FOLLOWS = "celery_funnel_follows"  # the message header naming the task followed
FOLLOW_TASK = "celery_funnel.follow"  # the task a follower completes as
POLL_FIRST_SECONDS = 0.2
POLL_MOST_SECONDS = 2.0
# the send options that make a send part of a canvas: its outcome goes somewhere
CANVAS_OPTIONS = ("chain", "link", "link_error", "chord", "group_id")


def unique_funnel(task: Any, spec: Unique, args: Any, kwargs: Any) -> str:
    """The funnel whose unique key a run of ``task`` with these arguments takes."""
    part = key_part(spec.key, task.run, args or (), kwargs or {})
    return runtime_for(task.app).task_key(task.name, part)


def in_canvas(options: dict[str, Any]) -> bool:
    """Whether a send with ``options`` (``apply_async``'s) is part of a canvas."""
    return any(options.get(name) for name in CANVAS_OPTIONS)


def follows_of(headers: Any) -> str:
    """The id of the task a message follows ("" for none)."""
    return str((headers or {}).get(FOLLOWS) or "")


def ended(task: Any, task_id: str) -> bool:
    """Whether the run of ``task_id`` stored its outcome (``task``'s result backend):
    False also when no backend can say (none configured, results ignored)."""
    try:
        return task.AsyncResult(task_id).state in states.READY_STATES - {states.REVOKED}
    except Exception:  # no result backend, or it cannot be read: no outcome known
        return False


class Next(Enum):
    """What a follower does on this pass."""

    WAIT = "wait"  # the task it follows holds the key still
    COMPLETE = "complete"  # complete with that task's outcome
    OWN = "own"  # that task left no outcome: it took the key, and runs its own body


class Follow:
    """The followers of one worker gate's unique tasks."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def next(self, request: Any, holder: str) -> Next:
        """Where the follower ``request`` (a Celery worker Request) of ``holder`` stands.

        Raises:
            BackendError: when the funnels' Redis fails (the follower waits).
        """
        spec: Unique | None = unique_of(request.task)
        if spec is None:  # no longer unique (a new release of the code): run it
            return Next.OWN
        self.runtime.outage.check()
        unique = self.runtime.unique
        funnel = unique_funnel(request.task, spec, request.args, request.kwargs)
        current = unique.holder(funnel)
        if current is not None and current[0] not in (holder, request.id):
            # another run took the key since: the one followed ended
            return Next.COMPLETE if ended(request.task, holder) else Next.WAIT
        if current is not None and current[0] == holder:
            return Next.WAIT
        if ended(request.task, holder):
            return Next.COMPLETE
        taken, _ = unique.claim(funnel, request.id, spec.ttl)
        return Next.OWN if taken else Next.WAIT

    @staticmethod
    def waiting(state: State) -> Ruling:
        """The wait of a follower before it looks again: 0.2, 0.4 … at most 2 s."""
        delay = min(POLL_FIRST_SECONDS * 2 ** min(state.deferrals, 8), POLL_MOST_SECONDS)
        return Ruling(run=False, delay=delay, state=state._replace(deferrals=state.deferrals + 1))

    @staticmethod
    def complete(request: Any) -> None:
        """Make ``request`` a run of ``FOLLOW_TASK``: its body returns the outcome of
        the task it follows, under the request's own id and message."""
        task = request.task.app.tasks[FOLLOW_TASK]
        request._type = request.name = FOLLOW_TASK  # what the pool runs
        request._task = task
