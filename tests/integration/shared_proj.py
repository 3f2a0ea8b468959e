"""A Celery app whose broker, results and funnels share one Redis database, for the
shared-Redis tests: ``make_shared_app``, and a module-level ``app`` (from
FUNNEL_SHARED_URL and FUNNEL_SHARED_PREFIX) for ``celery -A`` commands.

Its FunnelTask is named ``celery``, like Celery's default queue, and a worker-wide limit
covers it, so that ``celery funnel reset celery`` has a funnel and a queue to tell apart.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from celery_funnel import FunnelTask, install


def make_shared_app(url: str, prefix: str, funnel_url: str | None = None, **conf: Any) -> Celery:
    """Broker and result backend at ``url``, funnels at ``funnel_url`` (default: the
    same), their keys under ``prefix``. Besides the task ``celery``, one task per
    strategy (``strat.<name>``, 5/s), one with two limits (``strat.two``), and
    ``strat.plain`` under a worker-wide limit (20/s)."""
    app = Celery("shared", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        funnel_redis_url=funnel_url or url,
        funnel_key_prefix=prefix,
        funnel_limits={"cel*": "1/h", "strat.plain": "20/s"},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        **conf,
    )
    install(app)

    @app.task(shared=False, name="celery", base=FunnelTask, funnel_rate="1/h")
    def celery_named(n: int = 0) -> int:
        return n

    for strategy in ("gcra", "fixed_window", "sliding_window", "sliding_log"):
        options = {"funnel_rate": "5/s", "funnel_strategy": strategy}
        app.task(shared=False, name=f"strat.{strategy}", base=FunnelTask, **options)(_echo)
    app.task(
        shared=False, name="strat.two", base=FunnelTask, funnel_rate="10/s",
        funnel_key="{n}", funnel_limits=[{"rate": "5/s"}],
    )(_echo)  # fmt: skip
    app.task(shared=False, name="strat.plain")(_echo)
    return app


def _echo(n: int = 0) -> int:
    return n


if os.environ.get("FUNNEL_SHARED_URL"):
    app = make_shared_app(os.environ["FUNNEL_SHARED_URL"], os.environ["FUNNEL_SHARED_PREFIX"])
