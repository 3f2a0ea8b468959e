"""What the window strategies share: the grant rule and the reply read into a Decision."""

from __future__ import annotations

from collections.abc import Sequence

from ..decision import Decision
from ._common import seconds

# A window script admits when it grants the whole quantity (ARGV[3]); see decision.
ADMITTED = "r[1] >= tonumber(ARGV[3])"


def grant(quantity: int, free: int, partial: bool) -> int:
    """Units to grant: all of ``quantity`` if it fits, else what fits when ``partial``."""
    if quantity <= free:
        return quantity
    return max(free, 0) if partial else 0


def decision(limit: int, quantity: int, reply: Sequence[int]) -> Decision:
    """Build a ``Decision`` from a window script's ``{granted, used, retry, reset}``."""
    granted, used, retry_us, reset_us = reply
    return Decision(
        limited=granted < quantity,
        limit=limit,
        remaining=max(limit - used, 0),
        retry_after=seconds(retry_us),
        reset_after=seconds(reset_us),
        granted=granted,
    )
