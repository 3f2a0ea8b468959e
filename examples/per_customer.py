"""Per-customer keys: one funnel per customer, each at its own pace.

    python examples/per_customer.py

``funnel_key`` is a format string over the task's arguments (or a callable taking
them): each ``customer_id`` gets its own funnel of 2 tasks a second, so a busy customer
waits without slowing the others. Key parts are made safe (long, binary or odd values
are hashed), so arguments cannot escape the key prefix.
"""

from __future__ import annotations

import time

from _harness import check, peak, redis_url, run
from celery import Celery

from celery_funnel import FunnelTask, install

app = install(Celery("per_customer", broker=redis_url(), backend=redis_url()))
app.conf.funnel_redis_url = redis_url()


@app.task(base=FunnelTask, funnel_rate="2/s", funnel_key="{customer_id}")
def sync_account(customer_id: str, page: int) -> tuple[str, float]:
    return customer_id, time.time()


def produce() -> None:
    customers = ["acme", "globex", "initech"]
    results = [sync_account.delay(c, page) for page in range(6) for c in customers]
    done = [result.get(timeout=60) for result in results]
    by_customer: dict[str, list[float]] = {}
    for customer, at in done:
        by_customer.setdefault(customer, []).append(at)
    for customer, starts in sorted(by_customer.items()):
        span = max(starts) - min(starts)
        print(f"{customer:<8} 6 tasks over {span:.1f} s, at most {peak(starts)} in any second")
        check(peak(starts) <= 2 + 1, f"{customer}: at most 2/s (+1 for the first)")
    every = [at for _, at in done]
    check(peak(every) > 3, f"customers do not wait for each other ({peak(every)} in 1 s)")


if __name__ == "__main__":
    run(produce)
