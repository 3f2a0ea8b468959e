"""Revokes seen when they arrive: a parked task revoked (``celery control revoke``, or
``AsyncResult.revoke()``) is dropped when a worker sees the revoke, not at its release
time, which may be hours away. Celery's ``revoke`` broadcast adds the ids to every
worker's ``worker_state.revoked``; each releaser pass takes the ids added since its
last (``NewlyRevoked``) and makes those that are parked due now; the same pass claims
and drops them (``Releaser._drop``: a REVOKED result and a ``task-revoked`` event)."""

from __future__ import annotations

from typing import Any

from celery.worker import state as worker_state

__all__ = ["NewlyRevoked"]


class NewlyRevoked:
    """The ids added to a Celery ``LimitedSet`` (``worker_state.revoked`` unless
    ``revoked`` is given) since the last ``take()``; the first ``take()`` returns those
    already there (revokes kept in the worker's state file, ``--statedb``, or learnt
    from other workers at start)."""

    def __init__(self, revoked: Any = None) -> None:
        self._revoked = worker_state.revoked if revoked is None else revoked
        # the newest entry seen: insertion order, not its time, tells what is new (the
        # times of revokes learnt from other workers come from their clocks)
        self._newest: object = None

    def take(self) -> list[str]:
        """The ids revoked since the last call, newest first. The set's table is read
        from its newest end, so the work is the number of new ids; should the newest
        entry seen be gone (its id revoked again), the whole set is read once."""
        data = getattr(self._revoked, "_data", None)
        if not isinstance(data, dict):
            return []  # a Celery whose LimitedSet keeps no table: revokes at release
        found: list[str] = []
        newest = self._newest
        try:
            for item, entry in reversed(data.items()):
                if entry is self._newest:
                    break
                if newest is self._newest:
                    newest = entry
                found.append(str(item))
        except RuntimeError:  # the consumer added a revoke meanwhile: the next pass
            return []
        self._newest = newest
        return found
