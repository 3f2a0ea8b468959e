"""Django-style settings: every option in the ``CELERY_`` namespace.

    python examples/django_settings.py

A Django project loads Celery's settings with
``app.config_from_object("django.conf:settings", namespace="CELERY")``. celery-funnel
reads its settings in that spelling too (``CELERY_FUNNEL_REDIS_URL``,
``CELERY_FUNNEL_LIMITS`` ...). Here a plain class stands in for ``django.conf.settings``,
so the example needs no Django; in a project, the lines below go to ``settings.py``.
"""

from __future__ import annotations

import time
from typing import ClassVar

from _harness import check, peak, redis_url, run
from celery import Celery

from celery_funnel import FunnelTask, install


class Settings:  # settings.py
    CELERY_BROKER_URL = redis_url()
    CELERY_RESULT_BACKEND = redis_url()
    CELERY_FUNNEL_REDIS_URL = redis_url()
    CELERY_FUNNEL_KEY_PREFIX = "myproject:funnel:"
    CELERY_FUNNEL_LIMITS: ClassVar[dict[str, str]] = {"billing.*": "2/s"}
    CELERY_FUNNEL_MAX_COUNTDOWN = 600.0


app = Celery("django_settings")  # celery.py
app.config_from_object(Settings, namespace="CELERY")
install(app)


@app.task(name="billing.charge")
def charge(n: int) -> float:
    return time.time()


@app.task(base=FunnelTask, funnel_rate="3/s", name="notify.push")
def push(n: int) -> float:
    return time.time()


def funnel_keys() -> list[str]:
    from redis import Redis  # noqa: PLC0415

    with Redis.from_url(redis_url()) as client:
        return sorted(k.decode() for k in client.scan_iter("myproject:funnel:*"))


def produce() -> None:
    charges = [charge.delay(n) for n in range(6)]
    pushes = [push.delay(n) for n in range(6)]
    # funnels expire once full again: look while the tasks are running
    deadline = time.monotonic() + 10
    while not (keys := funnel_keys()) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("funnel keys:", keys)
    check(bool(keys), "CELERY_FUNNEL_KEY_PREFIX names the keys")
    charge_starts = [r.get(timeout=60) for r in charges]
    push_starts = [r.get(timeout=60) for r in pushes]
    check(peak(charge_starts) <= 2 + 1, f"CELERY_FUNNEL_LIMITS: billing.* at 2/s, capacity 1:"
          f" {peak(charge_starts)} starts in the busiest second (2 + 1 allowed)")  # fmt: skip
    check(peak(push_starts) <= 3 + 1, f"FunnelTask at 3/s, capacity 1: {peak(push_starts)}"
          f" starts in the busiest second (3 + 1 allowed)")  # fmt: skip


if __name__ == "__main__":
    run(produce)
