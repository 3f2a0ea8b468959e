"""A worker-wide limit on tasks you do not own (a library's, say): no code change.

    python examples/worker_wide.py

``funnel_limits`` maps task-name patterns to rates. The worker gate (installed by
``install(app)``) holds matching tasks in the worker until the shared funnel admits
them, so plain ``@app.task`` tasks, and tasks defined elsewhere, are limited across
every worker. ``"scope": "worker"`` would give each worker its own funnel instead.
"""

from __future__ import annotations

import time

from _harness import check, peak, redis_url, run
from celery import Celery

from celery_funnel import install

app = install(Celery("worker_wide", broker=redis_url(), backend=redis_url()))
app.conf.funnel_redis_url = redis_url()
app.conf.funnel_limits = {
    "thirdparty.*": {"rate": "4/s", "capacity": 1},  # every task of the package, together
}


# stands for tasks from a package you do not control
@app.task(name="thirdparty.send_email")
def send_email(n: int) -> float:
    return time.time()


@app.task(name="thirdparty.send_sms")
def send_sms(n: int) -> float:
    return time.time()


@app.task(name="mine.report")
def report(n: int) -> float:
    return time.time()


def produce() -> None:
    limited = [send_email.delay(n) for n in range(8)] + [send_sms.delay(n) for n in range(8)]
    free = [report.delay(n) for n in range(8)]
    report_starts = [r.get(timeout=60) for r in free]
    starts = [r.get(timeout=60) for r in limited]
    print(f"thirdparty.*: 16 tasks over {max(starts) - min(starts):.1f} s")
    check(peak(starts) <= 4 + 1, f"thirdparty.* at most 4/s together (saw {peak(starts)})")
    check(max(report_starts) - min(report_starts) < 2, "mine.report is not limited")


if __name__ == "__main__":
    run(produce)
