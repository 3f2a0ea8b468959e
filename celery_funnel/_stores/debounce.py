"""Debounced sends (``funnel_debounce``): each send of a key writes its message among
the parked tasks (``_stores.park``), replacing the one the key's open window holds, due
when no send came for the debounce time; the workers' releasers publish it then, exactly
as they release parked tasks (a claim with a lease, forgotten only after the publish:
nothing is lost when a producer or a worker dies). The window (``<prefix>{~parked}
#debounce:<task>[:<key part>]``, "<task id> <first send µs>") names the task id every
send of the burst shares; it is open while its entry waits unclaimed, so a send made
while the run is being released opens a new window, with a new id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._limiter.scripts import RedisClient
from .park import encode_message
from .store import ParkedStore, text

__all__ = ["DebounceStore", "Sent"]

US = 1_000_000


@dataclass(frozen=True)
class Sent:
    """What one debounced send did: ``stored`` (False: the window it expected is not
    the open one; ``task_id`` is the open one's, or "" for none), the run's task id,
    its release time (epoch seconds) and whether this send ``opened`` the window."""

    stored: bool
    task_id: str
    release: float = 0.0
    opened: bool = False


class DebounceStore(ParkedStore):
    """The debounced sends of one app in the funnels' Redis (``client``), under
    ``prefix``.

    Raises (every method): ``BackendError`` when Redis fails.
    """

    what = "the debounced tasks"

    def __init__(self, client: RedisClient, prefix: str) -> None:
        super().__init__(client, prefix)
        self._send = self.parked_script("debounce")

    def send(
        self,
        window: str,
        task_id: str,
        message: Mapping[str, Any],
        *,
        new: bool,
        wait: float,
        most: float | None,
        lead: float,
        keep: float,
    ) -> Sent:
        """Store ``message`` (see ``_stores.park.capture``, of task ``task_id``) as the
        run of ``window``, due ``wait`` seconds from now, at most ``most`` after the
        window's first send. ``new``: ``task_id`` was never sent (it may open a
        window); else it must be the open window's id. ``lead``: releasers claim
        entries this early; ``keep``: how long the window outlives the release."""
        label = str(message["meta"]["funnel"])
        bound = -1 if most is None else round(most * US)
        args = (
            task_id, "1" if new else "0", round(wait * US), bound, encode_message(message),
            label, round(lead * US), round(keep * US),
        )  # fmt: skip
        reply = self._script(self._send, [*self.keys, window], *args)
        if not int(reply[0]):
            return Sent(False, text(reply[1]))
        return Sent(True, text(reply[1]), int(reply[2]) / US, bool(int(reply[3])))
