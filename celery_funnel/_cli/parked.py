"""``celery -A proj funnel parked|release|purge``: the tasks parked in the funnels' Redis
until their release time (``_stores.park``), listed, released now, or deleted."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
from celery.bin.base import CeleryCommand

from .._config.runtime import runtime_for
from .._limiter.errors import ConfigurationError
from .._limiter.words import plural
from .._ops.view import Failure, at
from .._stores.park import ParkStore

__all__ = ["parked", "parked_summary", "purge", "release"]

SHOWN = 20


def store_of(ctx: click.Context) -> ParkStore:
    """The app's parked tasks (the funnels' Redis, the key prefix)."""
    runtime = runtime_for(ctx.obj.app)
    try:
        return ParkStore(runtime.funnel.client, runtime.settings.key_prefix)
    except ConfigurationError:
        raise  # the app's own settings, not reaching: the group says it in one line
    except Exception as exc:
        raise click.ClickException(f"cannot reach the parked tasks: {exc}") from None


def parked_summary(store: ParkStore) -> dict[str, Any]:
    """How many tasks each funnel holds parked, and the next release overall."""
    counts = store.counts()
    following = store.entries(1)
    return {
        "parked": counts,
        "next_release": at(following[0].release_at, server_time(store)) if following else None,
    }


def server_time(store: ParkStore) -> float:
    """The funnels' clock: the Redis server's TIME, epoch seconds."""
    seconds, micros = store.client.time()
    return int(seconds) + int(micros) / 1e6


@click.command(cls=CeleryCommand)
@click.argument("name", required=False)
@click.option("--limit", default=SHOWN, show_default=True, help="List at most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def parked(ctx: click.Context, name: str | None, limit: int, as_json: bool) -> None:
    """The parked tasks (of funnel NAME: a task name or limit:<pattern>), next first."""
    store = store_of(ctx)
    try:
        entries = store.entries(limit, name)
        summary = parked_summary(store)
    except Failure as exc:
        raise click.ClickException(str(exc)) from None
    now = server_time(store)
    rows = [
        {"task_id": e.task_id, "task": e.task, "funnel": e.funnel, "priority": e.priority,
         "release": at(e.release_at, now), "parked": at(e.parked_at, now)}
        for e in entries
    ]  # fmt: skip
    if as_json:
        click.echo(json.dumps({**summary, "tasks": rows}, indent=2))
        return
    for funnel, count in sorted(summary["parked"].items()):
        if name is None or funnel == name:
            ctx.obj.echo(f"{funnel}: {count} parked")
    for row in rows:
        ctx.obj.echo(f"  {row['task_id']}  {row['task']}  release {row['release']}")


def _acting(command: Callable[..., None]) -> click.Command:
    """The options of a command that acts on a funnel's parked tasks, or --all."""
    decorators: tuple[Callable[[Any], Any], ...] = (
        click.pass_context,
        click.option("--yes", is_flag=True, help="Do not ask for confirmation."),
        click.option("--all", "everything", is_flag=True, help="Every funnel's parked tasks."),
        click.argument("name", required=False),
    )
    for decorate in decorators:
        command = decorate(command)
    made: click.Command = click.command(cls=CeleryCommand)(command)  # type: ignore[no-untyped-call]
    return made


def _act(ctx: click.Context, name: str | None, everything: bool, yes: bool, release: bool) -> None:
    if everything == bool(name):
        raise click.UsageError("give a funnel NAME or --all")
    store = store_of(ctx)
    try:
        counts = store.counts()
        total = sum(counts.values()) if everything else counts.get(name or "", 0)
        if not total:
            ctx.obj.echo("no parked tasks")
            return
        what = "release now" if release else "delete (they will never run)"
        if not yes:
            whose = name or "every funnel"
            click.confirm(f"{what}: {plural(total, 'parked task')} of {whose}?", abort=True)
        done = store.purge(None if everything else name, release=release)
    except Failure as exc:
        raise click.ClickException(str(exc)) from None
    ctx.obj.echo(f"{'released' if release else 'purged'} {plural(done, 'parked task')}")


@_acting
def release(ctx: click.Context, name: str | None, everything: bool, yes: bool) -> None:
    """Release the tasks parked by funnel NAME (or --all) now, ahead of their slots."""
    _act(ctx, name, everything, yes, release=True)


@_acting
def purge(ctx: click.Context, name: str | None, everything: bool, yes: bool) -> None:
    """Delete the tasks parked by funnel NAME (or --all): they never run."""
    _act(ctx, name, everything, yes, release=False)
