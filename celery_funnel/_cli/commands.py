"""``celery -A proj funnel status|inspect|reset|check``: see, reset and check the app's
funnels. Registered as a Celery subcommand through the ``celery.commands`` entry point.

It only presents what the core computes (``_ops.view``), and only touches keys that
parse as keys of the layout (``_limiter.keys``): never a broker queue, a result, or another
app's key, whatever the prefix or the name given.
"""

from __future__ import annotations

import json
from typing import Any

import click
from celery.bin.base import CeleryCommand, handle_preload_options

from .._config.runtime import Runtime, runtime_for
from .._limiter.backends._clients import mask_url
from .._limiter.backends.redis import RedisFunnel
from .._limiter.errors import ConfigurationError
from .._limiter.keys import FunnelKey
from .._limiter.words import plural
from .._ops.configured import concurrency_in_force, idle_rows, in_force, parked_of
from .._ops.control import Override, families, overrides, owner
from .._ops.view import (
    Failure,
    Found,
    adaptive_rates,
    adaptive_text,
    at,
    describe,
    fair_lines,
    find,
    limit_of,
    resolve,
    unique_rows,
)
from .._stores.check import acl_line, check
from .._stores.park import ParkStore
from .concurrency import concurrency_rows, free_seat, show_holders
from .control import dashboard, override_lines, pause, resume, set_command, unset
from .errors import OneLineErrors
from .parked import parked, parked_summary, purge, release
from .why import why_command

SHOWN = 20  # keys listed before "... and N more"


def _connect(ctx: click.Context) -> tuple[Runtime, RedisFunnel]:
    runtime = runtime_for(ctx.obj.app)
    try:
        funnel = runtime.funnel
        if not isinstance(funnel, RedisFunnel):
            raise click.ClickException("the funnels are not kept in Redis")
        funnel.client.ping()
    except ConfigurationError:
        raise  # the app's own settings: the group says it in one line
    except Exception as exc:  # any failure to connect: one clear line
        if isinstance(exc, click.ClickException):
            raise
        raise click.ClickException(
            f"cannot reach the funnels' Redis (funnel_redis_url="
            f"{mask_url(runtime.settings.redis_url)!r}): {exc}"
        ) from None
    return runtime, funnel


WIDTH = 100  # a status row's note goes on a line of its own past this many columns
# the table's columns: the JSON field, its heading (short, to fit the rows in WIDTH)
COLUMNS = {
    "key": "key", "limit": "limit", "kind": "kind", "rate": "rate", "capacity": "cap",
    "remaining": "left", "reset_after": "reset_s", "reservations": "booked",
    "parked": "parked", "in_use": "in_use",
}  # fmt: skip
SPARSE = ("reservations", "parked", "in_use")  # shown when some row has one (not 0)


def _cell(row: dict[str, Any], field: str) -> str:
    value = row.get(field, "")
    return f"{value:.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def _echo_rows(ctx: click.Context, rows: list[dict[str, Any]], as_json: bool) -> None:
    """The rows as JSON, or as a table (``SPARSE`` columns only when a row has one, not
    0): one line per row (its note on the next line when the row would pass ``WIDTH``
    columns), then its seats' holders and its tenants."""
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    shown = {
        f: h
        for f, h in COLUMNS.items()
        if f not in SPARSE or any(_cell(r, f) not in ("", "0") for r in rows)
    }
    widths = {f: max([len(h), *(len(_cell(r, f)) for r in rows)]) for f, h in shown.items()}
    ctx.obj.echo("  ".join(h.ljust(widths[f]) for f, h in shown.items()) + "  note")
    for row in rows:
        line = "  ".join(_cell(row, f).ljust(widths[f]) for f in shown)
        note = str(row.get("note", ""))
        if note and len(line) + 2 + len(note) > WIDTH:
            ctx.obj.echo(line.rstrip())
            ctx.obj.echo(f"  note: {note}")
        else:
            ctx.obj.echo(f"{line}  {note}".rstrip())
        show_holders(ctx, row)
        if "error" in row:
            ctx.obj.echo(f"  error: {row['error']}")
        for line in fair_lines(row):
            ctx.obj.echo(line)


@click.group(name="funnel", cls=OneLineErrors)
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
def funnel(ctx: click.Context) -> None:
    """See, reset and check celery-funnel's funnels (in funnel_redis_url). Errors are one
    line; CELERY_FUNNEL_DEBUG=1 shows their traceback."""


@funnel.command(cls=CeleryCommand)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Every funnel of the app, idle ones too, and every funnel under the key prefix:
    its limit in force (a live override included), remaining, reset_after, bookings."""
    runtime, backend = _connect(ctx)
    found = find(backend.client, runtime.settings.key_prefix)
    store = ParkStore(backend.client, runtime.settings.key_prefix)
    counts = store.counts() if found.parked else {}
    entries, known = overrides(ctx.obj.app), families(ctx.obj.app)
    adapted = adaptive_rates(backend.client, runtime.settings.key_prefix)
    rows = []
    for key in found.funnels:
        name = owner(ctx.obj.app, key, known)
        row = _funnel_row(runtime, backend, key, entries.get(name or ""), adapted)
        row["parked"] = parked_of(row["name"], counts)
        rows.append(row)
    for row in concurrency_rows(runtime, backend.client, found):
        name = owner(ctx.obj.app, FunnelKey(row["key"], row["name"]), known)
        rows.append(_lease_row(row, entries.get(name or "")))
    rows += idle_rows(runtime, found, entries, parked=counts)
    held = unique_rows(backend.client, found)
    _echo_rows(ctx, rows + held if as_json else rows, as_json)
    for row in [] if as_json else held:
        ctx.obj.echo(
            f"unique: {row['key']} held by task {row.get('held_by')} (its claim ends in"
            f" {row.get('expires_in')} s unless renewed){row.get('error', '')}"
        )
    if found.parked and not as_json:
        summary = parked_summary(store)
        for label, count in sorted(summary["parked"].items()):
            ctx.obj.echo(f"parked: {plural(count, 'task')} of {label}")
        if summary["next_release"]:
            ctx.obj.echo(f"parked: next release {summary['next_release']}")
    if entries and not as_json:
        ctx.obj.echo("overrides:")
        for line in override_lines(ctx.obj.app, entries):
            ctx.obj.echo(f"  {line}")
    texts = {row["key"]: row["adaptive"] for row in rows if "adaptive" in row}
    for funnel_key, rate in [] if as_json else sorted(adapted.items()):
        text = texts.get(funnel_key, f"{rate:.3g}/s (lowered by 429s)")
        ctx.obj.echo(f"adaptive: {funnel_key} at {text}")
    if found.foreign and not as_json:  # another app's keys, or an older version's
        prefix = runtime.settings.key_prefix
        are = "is not" if found.foreign == 1 else "are not"
        ctx.obj.echo(
            f"({plural(found.foreign, 'key')} under the prefix {prefix!r} {are}"
            f" celery-funnel's: not shown, and never reset)"
        )


def _funnel_row(
    runtime: Runtime,
    backend: RedisFunnel,
    key: FunnelKey,
    override: Override | None,
    adapted: dict[str, float],
) -> dict[str, Any]:
    """A funnel found in Redis: its limit in force (``override`` applied) and state,
    and its adaptive rate (``adapted``: per second, by key; absent: at its max)."""
    limit, note = limit_of(runtime, key), ""
    if limit is not None:
        limit, note = in_force(limit, override)
    row = describe(backend, key, limit)
    if limit is not None and limit.adaptive is not None:
        row["adaptive"] = adaptive_text(adapted.get(key.key), limit)
    if override is not None:
        row["override"] = override.as_dict()
    if note:
        row["note"] = note
    return row


def _lease_row(row: dict[str, Any], override: Override | None) -> dict[str, Any]:
    """A concurrency funnel's row with the N in force (``override`` applied)."""
    if isinstance(row.get("capacity"), int):
        n, note = concurrency_in_force(row["capacity"], override)
        row.update(capacity=n, remaining=max(n - row.get("in_use", 0), 0))
        if note:
            row["note"] = note
    return row


def _resolve(runtime: Runtime, backend: RedisFunnel, name: str) -> Found:
    return resolve(runtime, backend.client, name)


@funnel.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def inspect(ctx: click.Context, name: str, as_json: bool) -> None:
    """One funnel NAME (a task name, limit:<pattern>, or a key as status shows it, such
    as one limit of a task with several) in detail, idle or not, with its booked tickets
    (times in UTC)."""
    runtime, backend = _connect(ctx)
    found = _resolve(runtime, backend, name)
    funnels, entries = found.funnels, overrides(ctx.obj.app)
    known = families(ctx.obj.app)
    adapted = adaptive_rates(backend.client, runtime.settings.key_prefix)
    try:
        now = backend.time()
        rows = []
        for key in funnels:
            override = entries.get(owner(ctx.obj.app, key, known) or "")
            row = _funnel_row(runtime, backend, key, override, adapted)
            row["tickets"] = [
                {"ticket": t, "slot": at(slot, now), "in_seconds": round(slot - now, 6)}
                for t, slot in backend.tickets(key.key, SHOWN)
            ]
            rows.append(row)
        for row in concurrency_rows(runtime, backend.client, found):  # concurrency funnels
            name_of = owner(ctx.obj.app, FunnelKey(row["key"], row["name"]), known)
            rows.append({**_lease_row(row, entries.get(name_of or "")), "tickets": []})
    except Failure as exc:
        raise click.ClickException(str(exc)) from None
    counts = ParkStore(backend.client, runtime.settings.key_prefix).counts()
    idle = idle_rows(runtime, found, entries, name, parked=counts)
    rows += [{**row, "tickets": []} for row in idle]
    if not rows:
        raise click.ClickException(
            f"no funnel {name!r} in this app nor under {runtime.settings.key_prefix!r}"
        )
    if as_json:
        click.echo(json.dumps(rows[0] if len(rows) == 1 else rows, indent=2))
        return
    for row in rows:
        for field, value in row.items():
            if field not in ("tickets", "holders"):
                ctx.obj.echo(f"{field:<14} {value}")
        show_holders(ctx, row)
        for ticket in row["tickets"]:
            ctx.obj.echo(f"  ticket {ticket['ticket']}: slot {ticket['slot']}")


def _delete(backend: RedisFunnel, keys: list[FunnelKey]) -> int:
    by_tag: dict[str, list[str]] = {}
    for key in keys:  # one DEL per hash tag: one Cluster slot each
        by_tag.setdefault(key.name, []).append(key.key)
    return sum(int(backend.client.delete(*group)) for group in by_tag.values())


@funnel.command(cls=CeleryCommand)
@click.argument("names", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every funnel under the key prefix.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def reset(ctx: click.Context, names: tuple[str, ...], everything: bool, yes: bool) -> None:
    """Forget funnels NAMES (task names, limit:<pattern>, or full keys; each with its
    key parts and tickets), or --all of them. Only keys that parse as funnel keys
    under funnel_key_prefix are deleted; the list is shown first."""
    if everything == bool(names):
        raise click.UsageError("give funnel NAMES or --all")
    runtime, backend = _connect(ctx)
    prefix = runtime.settings.key_prefix
    if not prefix:
        raise click.ClickException(
            "funnel_key_prefix is empty: reset cannot tell funnels from other keys; set a"
            " prefix (e.g. 'funnel:') and let the old keys expire"
        )
    try:
        found = [find(backend.client, prefix)] if everything else [
            _resolve(runtime, backend, n) for n in names
        ]  # fmt: skip
        keys = sorted({k.key: k for f in found for k in f.keys}.values(), key=lambda k: k.key)
        if not keys:
            ctx.obj.echo(f"no funnel keys to delete under {prefix!r}")
            return
        for key in keys[:SHOWN]:
            ctx.obj.echo(f"  {key.key}")
        if len(keys) > SHOWN:
            ctx.obj.echo(f"  ... and {len(keys) - SHOWN} more")
        if not yes:
            click.confirm(f"delete {plural(len(keys), 'funnel key')}?", abort=True)
        ctx.obj.echo(f"deleted {plural(_delete(backend, keys), 'key')}")
    except Failure as exc:
        raise click.ClickException(str(exc)) from None


@funnel.command(name="check", cls=CeleryCommand)
@click.pass_context
def check_command(ctx: click.Context) -> None:
    """Check the funnels' Redis: credentials, ACL (each script run once on scratch keys
    under the prefix), replica, eviction policy, persistence, and which rule lets tasks
    be parked there (an append-only file, or the broker's own Redis server). Exit
    status 1 on errors."""
    runtime = runtime_for(ctx.obj.app)
    prefix = runtime.settings.key_prefix
    ctx.obj.echo(f"funnel_redis_url: {mask_url(runtime.settings.redis_url)}")
    try:
        backend = runtime.funnel
    except Exception as exc:
        raise click.ClickException(str(exc)) from None
    parking = runtime.settings.park
    findings = []
    if isinstance(backend, RedisFunnel):
        findings = check(backend, prefix, parking=parking, persistence=runtime.persistence)
        ctx.obj.echo(f"parking: {runtime.persistence.describe()}")
    for finding in findings:
        ctx.obj.echo(finding.line())
    if any(f.topic in ("scripts", "connection") for f in findings):
        ctx.obj.echo(f"a Redis ACL user for celery-funnel needs:\n  {acl_line(prefix)}")
    if any(f.level == "error" for f in findings):
        ctx.exit(1)
    ctx.obj.echo("ok: celery-funnel can keep its funnels in this Redis")


for _command in (
    parked, release, purge, free_seat, set_command, pause, resume, unset, dashboard,
    why_command,
):  # fmt: skip
    funnel.add_command(_command)
