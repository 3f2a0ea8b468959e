"""``celery -A proj funnel why TASK_ID``: where one task is and when it runs
(``_ops.why``): held in a worker, parked, re-published, waiting for a seat, collapsed
into another task, already run, or unknown (exit status 1)."""

from __future__ import annotations

import click
from celery.bin.base import CeleryCommand

from .._config.runtime import runtime_for
from .._limiter.backends._clients import mask_url
from .._limiter.errors import ConfigurationError
from .._ops.why import dumps, why

__all__ = ["why_command"]


@click.command(name="why", cls=CeleryCommand)
@click.argument("task_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--timeout", default=1.0, show_default=True, help="Seconds to wait for the workers' replies."
)
@click.option(
    "--task", "task_name", help="The task's name: with --key, find a unique key's holder."
)
@click.option("--key", "key_part", help="The task's unique key part (its funnel_key, rendered).")
@click.pass_context
def why_command(
    ctx: click.Context,
    task_id: str | None,
    as_json: bool,
    timeout: float,
    task_name: str | None,
    key_part: str | None,
) -> None:
    """Where task TASK_ID is and when it runs: held in which worker, parked, published
    again, waiting for a seat, in the broker's queue, collapsed into another task,
    already run, or unknown (exit status 1). Without TASK_ID, --task NAME --key PART:
    the task that holds that unique key."""
    if task_id is None and not (task_name and key_part is not None):
        raise click.UsageError("give TASK_ID, or --task NAME and --key PART (a unique key)")
    runtime = runtime_for(ctx.obj.app)
    try:
        where = why(runtime, task_id, timeout=timeout, task=task_name, key=key_part)
    except ConfigurationError:
        raise  # the app's own settings: the group says it in one line
    except Exception as exc:  # the funnels' Redis, the broker: one clear line
        raise click.ClickException(
            f"cannot tell where task {task_id or key_part} is (funnel_redis_url="
            f"{mask_url(runtime.settings.redis_url)!r}): {exc}"
        ) from None
    if as_json:
        click.echo(dumps(where))
    else:
        for line in where.lines():
            ctx.obj.echo(line)
    if where.state == "unknown":
        ctx.exit(1)
