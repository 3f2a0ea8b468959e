"""The copies of a task: which copy of a task may go on, when the worker gate or a
releaser made more than one (``copy_accept.lua``, ``copy_move.lua``, ``_parked.lua``).

Every time a task moves (published again for a later time, parked, released), the
message it moved from and the one it moved to may both exist for a moment: the broker
keeps an un-acked message until it is acked, and an ack can be lost with its worker.
Each copy the gate or a releaser makes carries a token (the ``release`` field of the
``celery_funnel`` header), and the record of its task says which copies may go on:
the one accepted, else the first accepted of those published. A copy is checked when it
arrives carrying a token, or when the broker delivers a message again; a message as
first sent, delivered once, goes on without a check (nothing copied it yet).

A record follows one send of a task id at a time (``_shared.publish.origin`` tells sends
apart): a copy of another send of the id, while the first one's is on its way (parked,
or a copy published and not accepted yet), waits: ``CopiesBusyError``.

The records live beside the parked tasks (one hash tag), for ``KEEP_SECONDS`` after
their last change; a copy arriving after its record expired goes on (the record is
made again, so that a second copy arriving later is dropped).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from redis.exceptions import RedisError

from .._limiter.errors import BackendError, FunnelError
from .._limiter.scripts import RedisClient
from .store import ParkedStore, text

__all__ = ["KEEP_SECONDS", "Copies", "CopiesBusyError", "Record", "busy"]

US = 1_000_000
KEEP_SECONDS = 3600.0  # records of copies settled this long ago are forgotten
BATCH = 500  # runs recorded per call
BUSY = 2  # the scripts' reply: another send of the task id is on its way


class CopiesBusyError(FunnelError):
    """Another send of this task id is on its way (parked, or a copy of it published
    and not accepted yet): the copies' record follows that one until it settles. The
    message held is kept, and checked or moved again later; nothing is dropped."""


def busy(task_id: str, reply: int) -> int:
    """``reply`` (a script's first one), unless it says another send of ``task_id`` is
    on its way.

    Raises:
        CopiesBusyError: when it does.
    """
    if reply == BUSY:
        raise CopiesBusyError(f"another send of task {task_id} waits: this one waits after it")
    return reply


@dataclass(frozen=True)
class Record:
    """What the copies' record of one task says (``Copies.record``): ``pending``, copies
    published and none taken up by a worker yet; ``accepted``, a worker took one up;
    ``task``, its name (from the origin of its latest message); ``at``, when the record
    last changed (seconds since the epoch)."""

    pending: bool
    accepted: bool
    task: str | None
    at: float | None


class Copies(ParkedStore):
    """The copies' records of one app's tasks, in the funnels' Redis (``client``),
    under ``prefix`` (``funnel_key_prefix``).

    Raises (every method): ``BackendError`` when Redis fails.
    """

    what = "the copies of tasks"

    def __init__(self, client: RedisClient, prefix: str) -> None:
        super().__init__(client, prefix)
        self._accept, self._move, self._ran = map(
            self.parked_script, ("copy_accept", "copy_move", "copy_ran")
        )

    def accept(
        self,
        task_id: str,
        token: str,
        origin: str = "",
        *,
        drop: bool = False,
        redelivered: bool = False,
    ) -> bool:
        """A worker received copy ``token`` ("" for the message as first sent) of task
        ``task_id``: True when it goes on (it is the accepted copy now), False to drop
        it. ``origin``: what tells copies of one message from another message given the
        same id (``_shared.publish.origin``). ``drop``: the task was revoked; settle its
        record and let no copy go on. ``redelivered``: the broker delivered it again.

        Raises:
            CopiesBusyError: another send of ``task_id`` is on its way (check it again later).
        """
        flag = "drop" if drop else ""
        keep = round(KEEP_SECONDS * US)
        again = "1" if redelivered else "0"
        reply = self._script(self._accept, self.keys, task_id, token, flag, origin, keep, again)
        return bool(busy(task_id, int(reply[0])))

    def record(self, task_id: str) -> Record | None:
        """The record of task ``task_id`` (None: no copy of it was made or checked
        within ``KEEP_SECONDS``: it never waited, or the id is wrong). Reads only."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.keys.accepted, task_id)
        pipe.hget(self.keys.accepted, f"origin\0{task_id}")
        pipe.zscore(self.keys.accepted_at, task_id)
        try:
            copies, sends, at = pipe.execute()
        except RedisError as exc:
            raise BackendError(f"Redis failed on {self.what}: {exc}") from exc
        if copies is None and sends is None:
            return None
        kind = text(copies or "")
        # the latest message's origin: its task name, the run that sent it, ... (\1 token)
        latest = text(sends or "").split("\0")[-1].split("\1")[0]
        return Record(
            pending=">" in kind, accepted=kind.startswith("+"),
            task=latest.split("\n")[0] or None, at=None if at is None else float(at) / US,
        )  # fmt: skip

    def ran(self, runs: Iterable[tuple[str, str]]) -> int:
        """Runs started from these copies (task id, token) whose acks may not have
        reached the broker: the broker delivering those messages again is dropped.
        Returns how many it recorded (not those whose accepted copy is another by now)."""
        args = [item for run in runs for item in run]
        return sum(
            int(self._script(self._ran, self.keys, *args[start : start + 2 * BATCH])[0])
            for start in range(0, len(args), 2 * BATCH)
        )

    def move(self, task_id: str, held: str, new: str, origin: str = "") -> bool:
        """Record that copy ``new`` of task ``task_id`` is about to be published by the
        worker that holds copy ``held``: True to publish it (then ack the one held),
        False when the one held is stale (drop it, publish nothing).

        Raises:
            CopiesBusyError: another send of ``task_id`` is on its way (keep the one held).
        """
        reply = self._script(
            self._move, self.keys, task_id, held, new, origin, round(KEEP_SECONDS * US)
        )
        return bool(busy(task_id, int(reply[0])))
