"""``celery funnel status`` rows of the concurrency limits (N, in use, the holders, the
parked waiters), and ``celery funnel release-lease NAME TASK_ID``: an operator frees a
seat whose run is known to be gone, without waiting for its lease to run out."""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand

from .._celery.concurrency_renewal import RenewalService
from .._celery.task import FunnelTask
from .._config.options import concurrency_of
from .._config.runtime import Runtime, runtime_for
from .._limiter.keys import FunnelKey
from .._limiter.words import plural
from .._ops.view import Failure, Found, at, concurrency_funnels, resolve
from .._stores.concurrency import ConcurrencyFunnel, ConcurrencyStore

__all__ = ["concurrency_funnels", "concurrency_rows", "free_seat", "show_holders"]


def _seats_of(runtime: Runtime, key: FunnelKey) -> int | None:
    """The app's concurrency limit of funnel ``key``, if it has one."""
    for task in list(runtime.app.tasks.values()):
        n = concurrency_of(task) if isinstance(task, FunnelTask) else None
        if n is not None and key.of_task(task.name):
            return n
    for limit in runtime.settings.concurrency:
        if key.of_limit(limit.pattern):
            return limit.n
    return None


def concurrency_rows(runtime: Runtime, client: Any, found: Found) -> list[dict[str, Any]]:
    """One status row per concurrency funnel found: N, in use, waiting, holders."""
    store = ConcurrencyStore(client, runtime.settings.key_prefix, runtime.settings.lease_ttl)
    rows = []
    for key in concurrency_funnels(found):
        row: dict[str, Any] = {"key": key.key, "name": key.name, "kind": "concurrency"}
        try:
            seconds, micros = client.time()
            now = int(seconds) + int(micros) / 1e6
            holders = store.holders(key.key)
            n = _seats_of(runtime, key)
            row.update(capacity=n if n is not None else "?", in_use=len(holders))
            row["remaining"] = max(n - len(holders), 0) if n is not None else "?"
            row["parked"] = store.waiting(key.key)
            row["holders"] = [
                {
                    "task_id": h.task_id,
                    "worker": h.worker or _handed_to(h.held_by),
                    "age": None if h.started is None else round(now - h.started, 3),
                    "lease_expiry": at(h.expires, now),
                    "lease_ends_in": round(h.expires - now, 3),
                }
                for h in holders
            ]
        except Failure as exc:
            row["error"] = str(exc)
        rows.append(row)
    return rows


def _handed_to(held_by: str) -> str:
    """Who a seat handed to a waiter not yet arrived waits for."""
    return f"(handed to a waiter held by {held_by})" if held_by else "(handed to a parked waiter)"


def show_holders(ctx: click.Context, row: dict[str, Any]) -> None:
    """The holders of one concurrency row, one line each, under the row."""
    for h in row.get("holders", ()):
        age = "" if h["age"] is None else f", running {h['age']:.1f} s"
        ends = f"lease ends in {h['lease_ends_in']:.1f} s"
        ctx.obj.echo(f"    seat: task {h['task_id']} on {h['worker']}{age}, {ends}")


@click.command(name="release-lease", cls=CeleryCommand)
@click.argument("name")
@click.argument("task_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def free_seat(ctx: click.Context, name: str, task_id: str, yes: bool) -> None:
    """Free the concurrency seat TASK_ID holds in funnel NAME (a task name,
    limit:<pattern>, or a full key), as if its run had ended: for a run known to be
    gone, without waiting for its lease to run out. The seat goes to the oldest
    parked waiter, published at once."""
    runtime = runtime_for(ctx.obj.app)
    try:
        renewal = RenewalService(ctx.obj.app)
        found = resolve(runtime, renewal.store.client, name)
        funnels = []
        for key in concurrency_funnels(found):
            if any(h.task_id == task_id for h in renewal.store.holders(key.key)):
                funnels.append(ConcurrencyFunnel(_seats_of(runtime, key) or 1, key.key, key.name))
        if not funnels:
            raise click.ClickException(f"task {task_id} holds no slot of funnel {name!r}")
        for funnel in funnels:
            ctx.obj.echo(f"  {funnel.key}: slot of task {task_id}")
        if not yes:
            click.confirm(f"free the slot of task {task_id}?", abort=True)
        count, promoted = renewal.store.free(funnels, task_id, "*")
        renewal.hand_on(promoted)
    except Failure as exc:
        raise click.ClickException(str(exc)) from None
    freed, released = plural(count, "seat"), plural(len(promoted), "parked task")
    ctx.obj.echo(f"freed {freed}; {released} released")
