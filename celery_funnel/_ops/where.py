"""What ``celery funnel why`` answers (``_ops.why``): where one task is (``Where``),
in one to three lines or one JSON object; times in UTC ISO 8601."""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["STATES", "Where", "dumps", "utc"]

# what ``state`` says; ``unknown`` alone makes the command exit 1
STATES = (
    "held", "parked", "republished", "waiting", "queued", "collapsed", "done", "running",
    "reserved", "scheduled", "accepted", "unknown",
)  # fmt: skip


@dataclass(frozen=True)
class Where:
    """Where task ``task_id`` is (``state``, one of ``STATES``; ``where``, in words)
    and what is known of its wait. Times are UTC ISO 8601."""

    task_id: str
    state: str
    where: str
    task: str | None = None
    funnel: str | None = None
    eta: str | None = None  # held or re-published: when it is decided again
    release_at: str | None = None  # parked: when the releaser publishes it
    deferrals: int | None = None
    booked: bool | None = None  # a slot is booked under its id
    worker: str | None = None
    holder: str | None = None  # collapsed: the task it collapsed into
    result: str | None = None  # done: the result backend's state
    date_done: str | None = None
    place: int | None = None  # waiting: its place in the line (1: next)
    queue: str | None = None  # queued: the broker's queue it waits in
    unique_key: str | None = None  # asked by --task/--key: the unique key it holds

    def as_dict(self) -> dict[str, Any]:
        """The JSON object ``--json`` prints."""
        return asdict(self)

    def lines(self) -> list[str]:
        """One to three lines for a terminal."""
        if self.unique_key and not self.task_id:  # no task holds the key asked for
            return [f"unique key {self.unique_key}: {self.state} {self.where}"]
        name = f"task {self.task}[{self.task_id}]" if self.task else f"task {self.task_id}"
        first = f"{name}: {self.state} {self.where}"
        if self.unique_key:
            first = f"unique key {self.unique_key} held by {first}"
        if self.state == "unknown":
            return [first]
        more = []
        when = self.eta or self.release_at
        if when:
            more.append(f"{'runs' if self.state == 'parked' else 'decided again'} at {when}")
        if self.deferrals is not None:
            more.append(f"deferrals {self.deferrals}" + (", slot booked" if self.booked else ""))
        if self.date_done:
            more.append(f"done at {self.date_done}")
        return [first, "; ".join(more)] if more else [first]


def utc(value: Any) -> str | None:
    """An epoch time (seconds), a datetime or an ISO text as UTC ISO 8601 (None stays)."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        at = datetime.datetime.fromtimestamp(float(value), datetime.timezone.utc)
    elif isinstance(value, datetime.datetime):
        at = value
    else:
        at = datetime.datetime.fromisoformat(str(value))
    if at.tzinfo is None:  # Celery's naive times are UTC
        at = at.replace(tzinfo=datetime.timezone.utc)
    return at.astimezone(datetime.timezone.utc).isoformat(timespec="milliseconds")


def dumps(where: Where) -> str:
    """``where`` as the JSON object ``--json`` prints."""
    return json.dumps(where.as_dict(), indent=2)
