"""``celery -A proj funnel status|inspect|reset``: see and reset the app's funnels.

Registered as a Celery subcommand through the ``celery.commands`` entry point.
"""

from __future__ import annotations

import json
from typing import Any

import click
import redis
from celery.bin.base import CeleryCommand, handle_preload_options

from ._keys import tickets_key
from ._limit import Limit
from ._runtime import Runtime, runtime_for
from ._task_options import limits_of
from .strategies._common import US
from .task import FunnelTask


def _limits_by_key(runtime: Runtime) -> dict[str, Limit]:
    """Key base -> limit, for every FunnelTask of the app and every funnel_limits entry."""
    bases: dict[str, Limit] = {}
    for task in list(runtime.app.tasks.values()):
        if isinstance(task, FunnelTask):
            limits = limits_of(task)
            for i, limit in enumerate(limits):
                bases[runtime.task_key(task.name, "", None if len(limits) == 1 else i)] = limit
    for limit in runtime.settings.limits:
        bases[runtime.limit_key(limit.pattern)] = limit
    return bases


def _limit_for(key: str, bases: dict[str, Limit]) -> Limit | None:
    matches = [b for b in bases if key == b or key.startswith(b + ":")]
    return bases[max(matches, key=len)] if matches else None


def _describe(client: redis.Redis, key: str, bases: dict[str, Limit], now: int) -> dict[str, Any]:
    kind = client.type(key).decode()  # type: ignore[union-attr]
    limit = _limit_for(key, bases)
    row: dict[str, Any] = {"key": key, "kind": kind}
    if limit is not None:
        row.update(rate=str(limit.rate), capacity=limit.capacity, strategy=limit.strategy)
    if kind == "string":
        value = (client.get(key) or b"").decode()  # type: ignore[union-attr]
        if ":" in value:  # a sliding-window counter: "<sub-window>:<units>"
            row.update(kind="sliding_window counter", units=int(value.split(":")[1]))
        else:
            level = max(int(float(value)) - now, 0)
            row.update(kind="gcra", reset_after=level / US)
            if limit is not None and limit.strategy == "gcra":
                t = -(-round(limit.rate.period * US) // limit.rate.count)
                row["remaining"] = max((t * limit.capacity - level) // t, 0)
            row["reservations"] = client.zcard(tickets_key(key))
    elif kind == "hash":
        start, used = client.hmget(key, ["w", "n"])
        row.update(kind="fixed_window", used=int(used or 0), window_start=int(start or 0) / US)
    elif kind == "zset":
        row.update(kind="sliding_log", used=client.zcard(key))
    ttl = client.pttl(key)
    row["expires_in"] = None if ttl < 0 else ttl / 1000
    return row


def _connect(ctx: click.Context) -> tuple[Runtime, redis.Redis]:
    runtime = runtime_for(ctx.obj.app)
    try:
        client = runtime.funnel.client  # type: ignore[attr-defined]
        client.ping()
    except Exception as exc:
        raise click.ClickException(
            f"cannot reach the funnels' Redis (funnel_redis_url="
            f"{runtime.settings.redis_url!r}): {exc}"
        ) from exc
    return runtime, client


def _now_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * US + int(micros)


def _print(ctx: click.Context, rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    columns = ["key", "kind", "rate", "capacity", "remaining", "reset_after", "reservations"]
    widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
    ctx.obj.echo("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        ctx.obj.echo("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


@click.group(name="funnel")
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
def funnel(ctx: click.Context) -> None:
    """See and reset celery-funnel's funnels (in funnel_redis_url)."""


@funnel.command(cls=CeleryCommand)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Every funnel: its limit, level, remaining, reset_after and reservations."""
    runtime, client = _connect(ctx)
    bases, now = _limits_by_key(runtime), _now_us(client)
    keys = sorted(
        k.decode() for k in client.scan_iter(match=runtime.settings.key_prefix + "*", count=500)
    )
    rows = [_describe(client, k, bases, now) for k in keys if not k.endswith(":tickets")]
    _print(ctx, rows, as_json)


@funnel.command(cls=CeleryCommand)
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def inspect(ctx: click.Context, key: str, as_json: bool) -> None:
    """One funnel KEY in detail, with its booked tickets."""
    runtime, client = _connect(ctx)
    if not client.exists(key):
        raise click.ClickException(f"no funnel {key!r}")
    row = _describe(client, key, _limits_by_key(runtime), _now_us(client))
    tickets: list[tuple[bytes, float]] = client.zrange(  # type: ignore[assignment]
        tickets_key(key), 0, 19, withscores=True
    )
    row["tickets"] = [{"ticket": t.decode(), "slot": s / US} for t, s in tickets]
    if as_json:
        click.echo(json.dumps(row, indent=2))
    else:
        for name, value in row.items():
            ctx.obj.echo(f"{name:<14} {value}")


@funnel.command(cls=CeleryCommand)
@click.argument("key", required=False)
@click.option("--all", "everything", is_flag=True, help="Every funnel under the key prefix.")
@click.pass_context
def reset(ctx: click.Context, key: str | None, everything: bool) -> None:
    """Forget funnel KEY (its tickets and counters too), or --all of them."""
    runtime, client = _connect(ctx)
    if everything == bool(key):
        raise click.UsageError("give a KEY or --all")
    if everything:
        keys = list(client.scan_iter(match=runtime.settings.key_prefix + "*", count=500))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        ctx.obj.echo(f"deleted {len(keys)} keys")
        return
    assert key is not None
    deleted = client.delete(key, tickets_key(key))
    ctx.obj.echo(f"deleted {deleted} keys of {key}")
