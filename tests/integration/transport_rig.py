"""What the broker transport's worker tests share: a producer app, real workers of
``tests.integration.transport_proj`` on a broker, and what the broker still holds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celery_funnel.testing import CeleryWorkers
from tests.broker_options import restore_options
from tests.integration.transport_proj import TransportConf, counts, make_transport_app
from tests.polling import wait_for

__all__ = ["ROOT", "held", "producer", "ran_once", "restoring", "visible", "workers"]

ROOT = str(Path(__file__).resolve().parents[2])


def restoring(visibility: float = 2.0, **more: Any) -> dict[str, Any]:
    """Transport options under which an un-acked message comes back ``visibility``
    seconds after it was taken (scanned for every second)."""
    return {**restore_options(visibility), **more}


@contextmanager
def producer(conf: TransportConf) -> Iterator[Celery]:
    app = make_transport_app(conf)
    try:
        yield app
    finally:
        app.close()


@contextmanager
def workers(
    conf: TransportConf, count: int = 1, *options: str, env: dict[str, str] | None = None,
    prefix: str = "t",
) -> Iterator[CeleryWorkers]:  # fmt: skip
    """``count`` real workers of ``conf``, started (``options``: more worker options).
    Each warm shutdown ends on its own (SIGKILL after 90 s: a hang): a prefork worker's
    may take 30 s (``CeleryWorkers``), and killed, kombu's own transport loses the
    message its pending fetch popped (the stock case of the warm shutdowns' test)."""
    queues = ",".join(conf.queues)
    with CeleryWorkers(
        "tests.integration.transport_proj", count, {**conf.env(), **(env or {})},
        "-Q", queues, *(options or ("-c", "2")), cwd=ROOT, prefix=prefix, stop_timeout=90.0,
    ) as started:  # fmt: skip
        yield started


def visible(broker_url: str, visibility: float, prefix: str = "") -> None:
    """Wait until every un-acked record is older than ``visibility`` seconds: a worker
    started now restores them at once (kombu before 5.4 scans at a worker's start, then
    only every 100 s; later releases every second under ``restoring``)."""
    with redis.Redis.from_url(broker_url) as client:
        scores = [score for _, score in client.zrange(f"{prefix}unacked_index", 0, -1,
                                                       withscores=True)]  # fmt: skip
    if scores:
        wait_for(lambda: time.time() - max(scores) > visibility + 0.5, visibility + 30)


def ran_once(store_url: str, ids: list[str], timeout: float = 90.0) -> None:
    """Every task of ``ids`` ran, none twice (a hang fails after ``timeout`` s, naming
    the tasks that did not run)."""
    try:
        wait_for(lambda: set(counts(store_url)) >= set(ids), timeout)
    except AssertionError:
        raise AssertionError(f"not run: {sorted(set(ids) - set(counts(store_url)))}") from None
    assert {task: n for task, n in counts(store_url).items() if n > 1} == {}


def held(broker_url: str, prefix: str = "") -> int:
    """Messages the broker holds: in a queue list, or un-acked."""
    with redis.Redis.from_url(broker_url) as client:
        queued = sum(
            client.llen(key) for key in client.scan_iter(f"{prefix}*")
            if client.type(key) == b"list" and b"celery_funnel:wake:" not in key
            and b"pidbox" not in key
        )  # fmt: skip
        return int(queued) + int(client.hlen(f"{prefix}unacked"))
