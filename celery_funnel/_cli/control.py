"""``celery -A proj funnel set|pause|resume|unset|dashboard``: operate funnels live (the
commands call ``control``), and the lines ``status`` shows for overrides."""

from __future__ import annotations

import os
import time
from typing import Any

import click
from celery.bin.base import CeleryCommand

from .._config.runtime import runtime_for
from .._limiter.errors import ConfigurationError
from .._ops import control
from .._ops.view import utc_time
from .._shared.overrides import Override

__all__ = ["dashboard", "override_lines", "pause", "resume", "set_command", "unset"]

TOKEN_ENV = "CELERY_FUNNEL_DASHBOARD_TOKEN"


def _when(epoch: float) -> str:
    return utc_time(epoch)


def describe_override(app: Any, name: str, entry: Override) -> str:
    """One line: the code's limit, the override, who set it and when, until when."""
    limits = [f"{x.rate} capacity {x.capacity}" for x in control.code_limits(app, name)]
    n = control.code_concurrency(app, name)
    code = ", ".join([*limits, *([f"concurrency {n}"] if n is not None else [])])
    changes = [
        f"{field} {value}"
        for field, value in (("rate", entry.rate), ("capacity", entry.capacity),
                             ("concurrency", entry.concurrency))
        if value is not None
    ]  # fmt: skip
    if entry.paused:
        changes.append("PAUSED")
    until = ""
    if entry.expires_at is not None:
        until = f", until {_when(entry.expires_at)} (in {entry.expires_at - time.time():.0f} s)"
    return (
        f"{name}: code {code or '-'}; override {', '.join(changes)}; by {entry.by}"
        f" at {_when(entry.at)}{until}"
    )


def override_lines(app: Any, entries: dict[str, Override]) -> list[str]:
    """What ``status`` shows under "overrides:" for ``entries`` (``control.overrides``)."""
    return [describe_override(app, n, o) for n, o in sorted(entries.items())]


def _run(ctx: click.Context, action: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return action(ctx.obj.app, *args, **kwargs)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None


@click.command(name="set", cls=CeleryCommand)
@click.argument("name")
@click.argument("rate", required=False)
@click.option("--capacity", type=int, help="Burst: tasks that may start back to back.")
@click.option("--concurrency", type=int, help="At most this many running at once.")
@click.option("--ttl", help="Ends by itself after this long: 90s, 30m, 1h, 2d.")
@click.pass_context
def set_command(
    ctx: click.Context,
    name: str,
    rate: str | None,
    capacity: int | None,
    concurrency: int | None,
    ttl: str | None,
) -> None:
    """Override funnel NAME's RATE (like 20/s, 0.5/s or 5), capacity and/or concurrency on every
    worker within a second, without a restart."""
    entry = _run(
        ctx, control.set_override, name, rate, capacity=capacity, concurrency=concurrency, ttl=ttl
    )
    ctx.obj.echo(describe_override(ctx.obj.app, name, entry))


@click.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--ttl", help="The pause ends by itself after this long: 90s, 30m, 1h.")
@click.pass_context
def pause(ctx: click.Context, name: str, ttl: str | None) -> None:
    """Pause funnel NAME: nothing of it starts; its deferred tasks are parked."""
    entry = _run(ctx, control.pause, name, ttl=ttl)
    ctx.obj.echo(describe_override(ctx.obj.app, name, entry))


@click.command(cls=CeleryCommand)
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    """Resume funnel NAME; its parked tasks are released at once."""
    entry = _run(ctx, control.resume, name)
    line = f"{name}: resumed" if entry is None else describe_override(ctx.obj.app, name, entry)
    ctx.obj.echo(line)


@click.command(cls=CeleryCommand)
@click.argument("name")
@click.pass_context
def unset(ctx: click.Context, name: str) -> None:
    """Remove funnel NAME's override: back to the limit in the code, resumed."""
    had = _run(ctx, control.unset, name)
    ctx.obj.echo(f"{name}: back to the code's limit" if had else f"{name}: had no override")


@click.command(cls=CeleryCommand)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=5566, show_default=True, type=int)
@click.option("--token", default=None, help=f"Required to bind elsewhere (or ${TOKEN_ENV}).")
@click.option("--basic-auth", default=None, help="user:password, instead of a token.")
@click.pass_context
def dashboard(
    ctx: click.Context, host: str, port: int, token: str | None, basic_auth: str | None
) -> None:
    """Serve the web dashboard: every funnel live, with set/pause/resume/unset."""
    try:
        from ..dashboard import serve  # noqa: PLC0415 - the optional extra
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs Starlette and uvicorn: pip install starlette uvicorn (in a"
            f" clone of celery-funnel: pip install '.[dashboard]') ({exc})"
        ) from None
    token = token or os.environ.get(TOKEN_ENV) or None
    # a misconfigured app stops here, in one line, not in a traceback on every request
    runtime_for(ctx.obj.app).settings.require_redis()
    try:
        serve(ctx.obj.app, host=host, port=port, token=token, basic_auth=basic_auth)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
