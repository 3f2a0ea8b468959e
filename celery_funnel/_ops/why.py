"""Where one task is, and when it runs (``celery funnel why TASK_ID``), in one call.

Asked in this order, the cheap and certain first:

1. the parked tasks (``_stores.park``, by task id): parked until its release time, or a
   waiter queued for a seat of a concurrency funnel (``#waiters``), or the backup of a
   copy published again (then the workers are asked too, item 3);
2. the result backend: a ready state (SUCCESS, FAILURE, REVOKED) means it ran or ended;
   REVOKED as "duplicate of <id>" means a worker collapsed it into that task
   (``_celery.unique``);
3. the workers (``celery inspect funnel_waiting``): held by the worker gate, or published
   again and held by Celery as an ETA task until its countdown;
4. the workers again (``celery inspect query_task``): running, reserved or scheduled
   as Celery sees it;
5. a unique task's key, when the caller names it (``task``, ``key``): a send collapsed in
   the producer published nothing and left no record under its own id, only the key's
   holder, into which it collapsed;
6. else unknown.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from celery import states

from .._celery.waiting import COMMAND as WAITING
from .._config.runtime import Runtime
from .._limiter.keys import concurrency_keys, parked_keys
from .._shared.state import State
from .._stores.park import decode_message
from .view import find

__all__ = ["STATES", "Where", "why"]

US = 1_000_000
# what ``state`` says; ``unknown`` alone makes the command exit 1
STATES = (
    "held", "parked", "republished", "waiting", "collapsed", "done", "running", "reserved",
    "scheduled", "unknown",
)  # fmt: skip
DUPLICATE = "duplicate of "  # the reason a worker gives a unique task it dropped


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

    def as_dict(self) -> dict[str, Any]:
        """The JSON object ``--json`` prints."""
        return asdict(self)

    def lines(self) -> list[str]:
        """One to three lines for a terminal."""
        name = f"task {self.task}[{self.task_id}]" if self.task else f"task {self.task_id}"
        first = f"{name}: {self.state} {self.where}"
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


def why(
    runtime: Runtime,
    task_id: str,
    *,
    timeout: float = 1.0,
    task: str | None = None,
    key: str | None = None,
) -> Where:
    """Where task ``task_id`` of ``runtime``'s app is. ``timeout``: how long the
    workers' replies are waited for (each broadcast). ``task`` and ``key``: the task's
    name and unique key part, to find the task it collapsed into when nothing else
    knows it.

    Raises:
        BackendError: the funnels' Redis failed.
    """
    client = runtime.funnel.client
    found = parked(runtime, client, task_id) or finished(runtime.app, task_id)
    if found is None or found.state == "republished":  # a backup: the worker holding
        found = in_workers(runtime.app, task_id, timeout) or found  # its copy says more
    if found is None and task:
        found = collapsed(runtime, task_id, task, key or "")
    return found or Where(
        task_id, "unknown",
        "(not parked, not held nor running in any worker that answered, no result stored)",
    )  # fmt: skip


def parked(runtime: Runtime, client: Any, task_id: str) -> Where | None:
    """``task_id`` among the parked tasks: parked until its release, or a waiter."""
    keys = parked_keys(runtime.settings.key_prefix)
    raw = client.hget(keys.entries, task_id)
    if raw is None:
        return None
    score = client.zscore(keys.due, task_id)
    message = decode_message(raw)
    meta: Mapping[str, Any] = message.get("meta") or {}
    state = State.from_headers(message.get("headers"))
    fields: dict[str, Any] = {
        "task": meta.get("task"), "funnel": meta.get("funnel"), "deferrals": state.deferrals,
        "booked": state.booked,
    }  # fmt: skip
    place = waiter_place(runtime, client, task_id)
    if place is not None:
        return Where(
            task_id, "waiting", f"for a seat of {fields['funnel']} (place {place[1]} in line),"
            " parked until a seat frees", place=place[1], **fields,
        )  # fmt: skip
    if score is None and not client.hexists(keys.labels, task_id):  # a copy's backup
        return Where(
            task_id, "republished", "with a countdown, not taken up by a worker yet (its"
            " backup in the funnels' Redis is published again should none take it up)",
            **fields,
        )  # fmt: skip
    if score is None:  # claimed by a releaser: on its way to a worker
        return Where(task_id, "parked", "and being released by a worker's releaser", **fields)
    release = utc(float(score) / US)
    return Where(
        task_id, "parked", f"in the funnels' Redis until {release}", release_at=release, **fields
    )


def waiter_place(runtime: Runtime, client: Any, task_id: str) -> tuple[str, int] | None:
    """The concurrency funnel ``task_id`` waits for a seat of, and its place in line."""
    for funnel_key in find(client, runtime.settings.key_prefix).keys:
        if funnel_key.companion != "waiters":
            continue
        rank = client.zrank(concurrency_keys(funnel_key.funnel).waiters, task_id)
        if rank is not None:
            return funnel_key.funnel, int(rank) + 1
    return None


def finished(app: Any, task_id: str) -> Where | None:
    """``task_id``'s outcome, when its result backend stored one."""
    try:
        meta = app.AsyncResult(task_id).backend.get_task_meta(task_id)
    except Exception:  # no result backend, or it cannot be read: nothing known
        return None
    status = meta.get("status")
    if status not in states.READY_STATES:
        return None
    done, result = utc(meta.get("date_done")), meta.get("result")
    if status == states.REVOKED and str(result).startswith(DUPLICATE):
        holder = str(result)[len(DUPLICATE) :]
        return Where(
            task_id, "collapsed", f"into task {holder}: a worker dropped it as a duplicate"
            " (its unique key was held), never run", task=meta.get("name"), holder=holder,
            result=status, date_done=done,
        )  # fmt: skip
    return Where(
        task_id, "done", f"({status}, in the result backend)", task=meta.get("name"),
        result=status, date_done=done,
    )  # fmt: skip


def in_workers(app: Any, task_id: str, timeout: float) -> Where | None:
    """``task_id`` in a worker: waiting for a funnel (``funnel_waiting``), or as Celery
    sees it (``query_task``: running, reserved, scheduled)."""
    replies = app.control.broadcast(WAITING, reply=True, timeout=timeout) or []
    for reply in replies:
        for worker, rows in reply.items():
            for row in rows if isinstance(rows, list) else ():
                if row.get("id") == task_id:
                    return _waiting(task_id, worker, row)
    answers = app.control.inspect(timeout=timeout).query_task(task_id) or {}
    for worker, found in answers.items():
        if task_id in (found or {}):
            seen, info = found[task_id]
            state = {"active": "running"}.get(seen, seen)
            if state in STATES:
                return Where(
                    task_id, state, f"in worker {worker} (Celery's query_task)",
                    task=(info or {}).get("name"), worker=worker,
                )  # fmt: skip
    return None


def _waiting(task_id: str, worker: str, row: Mapping[str, Any]) -> Where:
    how, eta = row.get("how"), utc(row.get("eta"))
    where = (
        f"in worker {worker} by funnel {row.get('funnel')}" if how == "held" else
        f"with a countdown; worker {worker} holds it as an ETA task"
    )  # fmt: skip
    return Where(
        task_id, str(how), where, task=row.get("name"), funnel=row.get("funnel") or None,
        eta=eta, deferrals=row.get("deferrals"), booked=row.get("booked"), worker=worker,
    )  # fmt: skip


def collapsed(runtime: Runtime, task_id: str, task: str, key: str) -> Where | None:
    """A send of ``task`` with unique key part ``key`` that found the key held by
    another task published nothing: that task is the one it collapsed into."""
    held = runtime.unique.holder(runtime.task_key(task, key))
    if held is None or held[0] == task_id:
        return None
    return Where(
        task_id, "collapsed", f"into task {held[0]}, which holds its unique key (its claim"
        f" ends in {held[1]:.0f} s unless renewed)", task=task,
        holder=held[0],
    )  # fmt: skip


def dumps(where: Where) -> str:
    """``where`` as the JSON object ``--json`` prints."""
    return json.dumps(where.as_dict(), indent=2)
