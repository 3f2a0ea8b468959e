"""What a funnel answers: ``Decision`` for one throttle call, ``Reservation`` for a booking."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Decision", "Reservation"]

_US = 1_000_000


def us_to_seconds(us: int) -> float:
    """Integer microseconds to float seconds; -1 stays -1.0 (the 'never' marker)."""
    return us / _US


def _cell_seconds(seconds: float) -> int:
    # redis-cell replies whole seconds and rounds a partial second up when it
    # holds at least one millisecond, so a fast caller never retries too early.
    us = round(seconds * _US)
    if us < 0:
        return -((-us) // _US)
    whole, part = divmod(us, _US)
    return whole + (1 if part >= 1000 else 0)


class Decision(NamedTuple):
    """The answer to one ``throttle`` call, with ``CL.THROTTLE``'s meaning.

    An immutable named tuple (cheap to build on the hot path, picklable).

    Attributes:
        limited: the request was refused (nothing was taken from the funnel).
        limit: how many units the funnel holds when idle (``max_burst + 1`` for GCRA,
            the window's limit for window strategies).
        remaining: how many units could still be taken right now.
        retry_after: seconds until the same request would be admitted; ``-1.0`` when
            it was admitted, or when its quantity can never fit.
        reset_after: seconds until the funnel is idle (full capacity) again.
        granted: units taken by this call: the quantity when admitted, 0 when
            limited, or part of it for window strategies with ``partial=True``.
    """

    limited: bool
    limit: int
    remaining: int
    retry_after: float
    reset_after: float
    granted: int = 0

    @property
    def allowed(self) -> bool:
        """``not limited``."""
        return not self.limited

    def as_cell(self) -> tuple[int, int, int, int, int]:
        """The five integers redis-cell's ``CL.THROTTLE`` would reply.

        Times are whole seconds, a partial second (>= 1 ms) rounded up.
        """
        return (
            int(self.limited),
            self.limit,
            self.remaining,
            _cell_seconds(self.retry_after),
            _cell_seconds(self.reset_after),
        )


class Reservation(NamedTuple):
    """The answer to one ``reserve`` call.

    Attributes:
        admitted: the caller may start now (a free unit was taken, or its ticket was
            redeemed inside the ticket window).
        delay: seconds from now until the caller's slot: 0.0 when admitted; > 0 when a
            slot is booked (``booked``), or when a booking was refused because it was
            further away than ``max_wait``; -1.0 when the quantity can never fit.
        booked: a slot is held for the ticket (new, or booked by an earlier call), so
            the caller should come back after ``delay`` and redeem it.
        limit: ``max_burst + 1``.
        reset_after: seconds until the funnel is idle again, counting every booking.
        stale: the redeemed ticket came after its window; it was dropped (and the
            caller admitted or booked anew), so the caller should widen ``late``.
    """

    admitted: bool
    delay: float
    booked: bool
    limit: int
    reset_after: float
    stale: bool = False

    @property
    def never(self) -> bool:
        """The quantity is larger than the funnel and can never be admitted."""
        return self.delay < 0
