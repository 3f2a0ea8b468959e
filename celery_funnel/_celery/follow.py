"""The task a follower of a unique task completes as (``_shared.follow``): registered
on every installed app as ``celery_funnel.follow``. Its run returns the outcome of the
task the follower follows (its return value, or its exception raised again), under the
follower's own id and message, so that Celery carries the follower's canvas on: the
next link of its chain, its callbacks or errbacks, its group's result, its chord."""

from __future__ import annotations

from typing import Any

from .._limiter.errors import FunnelError
from .._shared.follow import FOLLOW_TASK, follows_of

__all__ = ["register"]

OUTCOME_TIMEOUT_SECONDS = 30.0  # the outcome is stored when the gate hands it over


def register(app: Any) -> None:
    """Register ``celery_funnel.follow`` on ``app`` (once)."""
    if FOLLOW_TASK in app.tasks:
        return

    @app.task(name=FOLLOW_TASK, bind=True, shared=False)  # type: ignore[untyped-decorator]
    def follow(self: Any, *_args: Any, **_kwargs: Any) -> Any:
        """The outcome of the unique task this follower follows."""
        holder = follows_of(self.request.headers)
        if not holder:
            raise FunnelError(f"task {self.request.id} follows no task: nothing to complete")
        result = self.app.AsyncResult(holder)
        return result.get(
            timeout=OUTCOME_TIMEOUT_SECONDS, propagate=True, disable_sync_subtasks=False
        )
