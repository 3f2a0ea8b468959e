"""Quickstart: one limit, shared by every worker.

    python examples/quickstart.py      # a private Redis and two workers, no set-up

``fetch`` may start 5 times a second, at most 2 back to back, whichever worker runs it.
A task that comes too early is not run: it goes back to the broker with a countdown
equal to the funnel's exact wait, and runs then.
"""

from __future__ import annotations

import time

from _harness import check, peak, per_second, redis_url, run
from celery import Celery

from celery_funnel import FunnelTask, install

app = install(Celery("quickstart", broker=redis_url(), backend=redis_url()))
app.conf.funnel_redis_url = redis_url()  # where the funnels live (here: the broker's Redis)


@app.task(base=FunnelTask, funnel_rate="5/s", funnel_capacity=2)
def fetch(n: int) -> float:
    """Stands for a call to an API that allows 5 requests a second."""
    return time.time()


def produce() -> None:
    results = [fetch.delay(n) for n in range(20)]
    starts = [result.get(timeout=60) for result in results]
    print("starts per second:", per_second(starts))
    check(len(starts) == 20, "all 20 tasks ran")
    check(peak(starts) <= 5 + 2, f"{peak(starts)} starts in the busiest second (5/s + 2 allowed)")


if __name__ == "__main__":
    run(produce)
