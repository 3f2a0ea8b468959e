"""Errors of the command lines, one line each: ``celery funnel ...`` (click's
``Error: ...``, exit status 1) and ``celery-funnel``. A celery-funnel error names its
fix; anything else is named by its type. ``CELERY_FUNNEL_DEBUG=1`` shows the traceback
instead (the commands have no ``--loglevel``)."""

from __future__ import annotations

import os
from typing import Any

import click

from .._limiter.errors import FunnelError

__all__ = ["DEBUG_ENV", "OneLineErrors", "debugging", "one_line"]

DEBUG_ENV = "CELERY_FUNNEL_DEBUG"


def debugging() -> bool:
    """Whether ``$CELERY_FUNNEL_DEBUG`` asks for tracebacks (set, and not 0/false/no/off)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def one_line(error: BaseException) -> str:
    """What to print for ``error``: its own words for a celery-funnel error (they name
    the fix), else its type and words, and how to see the traceback."""
    if isinstance(error, FunnelError):
        return str(error)
    return f"{type(error).__name__}: {error} (set {DEBUG_ENV}=1 for the traceback)"


class OneLineErrors(click.Group):
    """The ``funnel`` group: whatever a subcommand raises ends as one line, not as a
    traceback (a misconfigured app gave two chained ones, 72 lines)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own: already one line, or an exit code
        except Exception as error:
            if debugging():
                raise
            raise click.ClickException(one_line(error)) from None
