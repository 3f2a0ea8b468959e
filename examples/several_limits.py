"""Several limits on one task, all enforced at once, atomically.

    python examples/several_limits.py

An upstream allows each tenant 3 requests a second and everyone together 5 a second.
``funnel_limits`` adds limits to the task's own; a task runs only when every funnel
admits it, and one Lua script books all of them or none (their keys share one Redis
Cluster hash slot).
"""

from __future__ import annotations

import time

from _harness import check, peak, redis_url, run
from celery import Celery

from celery_funnel import FunnelTask, install

app = install(Celery("several_limits", broker=redis_url(), backend=redis_url()))
app.conf.funnel_redis_url = redis_url()


@app.task(
    base=FunnelTask,
    funnel_rate="3/s",  # per tenant ...
    funnel_key="{tenant}",
    funnel_limits=[{"rate": "5/s", "capacity": 1}],  # ... and 5/s over all tenants
)
def call_upstream(tenant: str, n: int) -> tuple[str, float]:
    return tenant, time.time()


def produce() -> None:
    results = [call_upstream.delay(t, n) for n in range(8) for t in ("red", "blue")]
    done = [r.get(timeout=60) for r in results]
    every = [at for _, at in done]
    for tenant in ("red", "blue"):
        starts = [at for t, at in done if t == tenant]
        check(peak(starts) <= 3 + 1, f"{tenant}: {peak(starts)} starts in its busiest second"
              f" (3/s + 1 allowed)")  # fmt: skip
    check(peak(every) <= 5 + 1, f"all tenants: {peak(every)} starts in the busiest second"
          f" (5/s + 1 allowed)")  # fmt: skip
    print(f"16 tasks over {max(every) - min(every):.1f} s")


if __name__ == "__main__":
    run(produce)
