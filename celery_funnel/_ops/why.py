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
6. the broker: its message in a queue (a Redis broker is searched; ``_ops.broker_queue``),
   or, by the copies' record (``_stores.copies``), a copy published again or released
   that no worker took up yet: queued;
7. the copies' record again: a worker took a copy of it up, and nothing above knows it
   now (it ran with its result not kept, or it moved on meanwhile): accepted;
8. else unknown: a wrong id, or (RabbitMQ, which cannot be searched) a message in a
   queue, which the answer then says holds so many messages.

A task moves while it is asked about: when nothing knew it, it is asked once more. The
workers asked are the ones whose live thread wrote lately (``_ops.live``): each
broadcast ends as soon as they all answered (``--timeout`` is for one that does not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from celery import states

from .._celery.waiting import COMMAND as WAITING
from .._config.runtime import Runtime
from .._limiter.keys import concurrency_keys, parked_keys
from .._shared.state import State
from .._stores.copies import Copies, Record
from .._stores.park import decode_message
from .broker_queue import InBroker, in_broker
from .live import live_workers
from .view import find
from .where import STATES, Where, dumps, utc

__all__ = ["STATES", "Where", "dumps", "utc", "why"]

US = 1_000_000
DUPLICATE = "duplicate of "  # the reason a worker gives a unique task it dropped
# a worker counts as there when its live thread wrote this recently (it writes twice a
# second; the margin is for clocks that differ between machines)
LIVE_SECONDS = 60.0


def why(
    runtime: Runtime,
    task_id: str | None,
    *,
    timeout: float = 1.0,
    task: str | None = None,
    key: str | None = None,
) -> Where:
    """Where task ``task_id`` of ``runtime``'s app is. ``timeout``: how long a worker's
    reply is waited for. ``task`` and ``key``: the task's name and unique key part, to
    find the task it collapsed into when nothing else knows it; without ``task_id``,
    the task that holds that key.

    Raises:
        BackendError: the funnels' Redis failed.
    """
    if task_id is None:
        return holding(runtime, task or "", key or "", timeout)
    found = _look(runtime, task_id, timeout, task, key)
    if found.state == "unknown":  # it may have moved between two of the places asked
        found = _look(runtime, task_id, timeout, task, key)
    return found


def _look(
    runtime: Runtime, task_id: str, timeout: float, task: str | None, key: str | None
) -> Where:
    client = runtime.funnel.client
    record = Copies(client, runtime.settings.key_prefix).record(task_id)
    found = parked(runtime, client, task_id) or finished(runtime.app, task_id)
    if found is None or found.state == "republished":  # a backup: the worker holding
        found = in_workers(runtime, task_id, timeout) or found  # its copy says more
    if found is None and task:
        found = collapsed(runtime, task_id, task, key or "")
    broker = None
    if found is None:
        try:
            broker = in_broker(runtime.app, task_id)
        except Exception:  # the broker cannot be read now: the rest is still said
            broker = None
        found = queued(task_id, broker, record)
    if found is None and record is not None and record.accepted:
        at = f" at {utc(record.at)}" if record.at else ""
        found = Where(
            task_id, "accepted", f"by a worker{at} (its copies' record), and since then"
            " not waiting nor running in any worker that answered, no result stored: it"
            " ran with its result not kept, or it moved on meanwhile (ask again)",
        )  # fmt: skip
    found = found or Where(task_id, "unknown", _nowhere(broker))
    name = found.task or (record.task if record else None) or task
    return found if found.task == name else replace(found, task=name)


def _nowhere(broker: InBroker | None) -> str:
    """What an unknown task is not, with what the broker's queues hold."""
    said = "(not parked, not held nor running in any worker that answered, no result stored"
    if broker is None:
        return said + ")"
    if broker.searched is not None:
        complete = "" if broker.complete else f", the first {broker.searched}"
        return f"{said}, not among the broker's messages{complete}: a wrong id?)"
    waiting = broker.waiting or {}
    counts = ", ".join(f"{n} in {queue}" for queue, n in sorted(waiting.items())) or "none"
    if not any(waiting.values()):
        return f"{said}, and no message waits in the app's queues ({counts}): a wrong id?)"
    return (
        f"{said}; the broker cannot be searched: it may be among the messages waiting in"
        f" its queues ({counts}), or the id is wrong)"
    )


def queued(task_id: str, broker: InBroker | None, record: Record | None) -> Where | None:
    """``task_id`` in the broker: its message found in a queue or un-acked, or a copy
    of it published (again, or released) that no worker took up yet."""
    place, queue = (None, None) if broker is None else (broker.place, broker.queue)
    if place == "queue":
        return Where(
            task_id, "queued", f"in the broker's queue {queue}, not taken up by a worker"
            " yet", queue=queue,
        )  # fmt: skip
    if place == "unacked":
        return Where(
            task_id, "queued", "in the broker, delivered to a worker that has not acked it"
            " and none that answered holds it: the broker gives it again after its"
            " visibility timeout",
        )  # fmt: skip
    if record is not None and record.pending:
        return Where(
            task_id, "queued", "in the broker: a copy published again or released, on"
            " its way back to a worker",
        )  # fmt: skip
    return None


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


def in_workers(runtime: Runtime, task_id: str, timeout: float) -> Where | None:
    """``task_id`` in a worker: waiting for a funnel (``funnel_waiting``), or as Celery
    sees it (``query_task``: running, reserved, scheduled). The workers whose live
    thread wrote lately are asked, and their replies awaited until all came (or
    ``timeout``); none known: every worker, for ``timeout``."""
    app = runtime.app
    nodes = sorted(live_workers(runtime.funnel.client, runtime.settings.key_prefix, LIVE_SECONDS))
    asked: dict[str, Any] = {"destination": nodes, "limit": len(nodes)} if nodes else {}
    replies = app.control.broadcast(WAITING, reply=True, timeout=timeout, **asked) or []
    for reply in replies:
        for worker, rows in reply.items():
            for row in rows if isinstance(rows, list) else ():
                if row.get("id") == task_id:
                    return _waiting(task_id, worker, row)
    answers = app.control.inspect(timeout=timeout, **asked).query_task(task_id) or {}
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
    how, eta, funnel = row.get("how"), utc(row.get("eta")), row.get("funnel") or None
    by = f" by funnel {funnel}" if funnel else ""
    where = (
        f"in worker {worker}{by}" if how == "held" else
        f"with a countdown{by}; worker {worker} holds it as an ETA task"
    )  # fmt: skip
    return Where(
        task_id, str(how), where, task=row.get("name"), funnel=funnel, eta=eta,
        deferrals=row.get("deferrals"), booked=row.get("booked"), worker=worker,
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


def holding(runtime: Runtime, task: str, key: str, timeout: float) -> Where:
    """The task holding unique key part ``key`` of ``task`` (``why --task --key``,
    no task id): where it is, or unknown when no task holds the key."""
    unique_key = runtime.task_key(task, key)
    held = runtime.unique.holder(unique_key)
    if held is None:
        return Where("", "unknown", "(no task holds it now)", task=task, unique_key=unique_key)
    found = why(runtime, held[0], timeout=timeout, task=task)
    return replace(found, unique_key=unique_key)
