"""An upstream that publishes nothing and halves its limit mid-run: the adaptive rate.

    python examples/llm_adaptive.py

The upstream (``celery_funnel.testing.MeteredUpstream`` with ``publish=False``: no
rate-limit header, not even ``Retry-After``) allows 20 requests/s with a bucket of 10,
twice the funnel's capacity (so the scheduling jitter between the gate's decision and
the call's arrival draws no 429 before the halving), and silently drops to 10/s with a
bucket of 5 three seconds into the run. The task's ``requests`` limit is
20/s with ``"adaptive"``: each 429 (``funnel_feedback(..., status=429)``) lowers the
rate for every worker (halved, at most once a second), each success lets it climb
back by 1/s a second, but not up to the rate that drew the last 429: the 429s stop.
A refused call is deferred and runs again: every call reaches the upstream once with
a 200. Two workers with 4 processes each run 300 calls: time for the
few 429s the halving draws, and then for 80 calls and more without one.

``LLM_ADAPTIVE=0`` runs without the adaptive mode (each 429 still holds the funnel
for a second); ``LLM_SUMMARY`` names a file to write what the upstream saw (JSON), for
the test and the benchmark.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from _harness import check, redis_url, run
from celery import Celery

from celery_funnel import FunnelTask, control, install
from celery_funnel.testing import MeteredUpstream

app = install(Celery("llm_adaptive", broker=redis_url(), backend=redis_url()))
app.conf.funnel_redis_url = redis_url()
UPSTREAM = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:0")
ADAPTIVE = os.environ.get("LLM_ADAPTIVE", "1") == "1"
CALLS = 300
BEFORE, AFTER, HALVE_AFTER = 20.0, 10.0, 3.0  # requests/s; seconds after the first call
BURST_BEFORE, BURST_AFTER = 10.0, 5.0  # the upstream's bucket, requests

REQUESTS: dict[str, Any] = {"name": "requests", "rate": "20/s", "capacity": 5}
if ADAPTIVE:  # 429: rate x 0.5 (at most once a second); success: +1/s a second
    REQUESTS["adaptive"] = {"min": "1/s", "decrease": 0.5, "increase": "1/s", "every": 1.0}


@app.task(bind=True, base=FunnelTask, funnel_limits=[REQUESTS])
def chat(self: Any, n: int) -> int:
    body = json.dumps({"n": n}).encode()
    request = urllib.request.Request(
        f"{UPSTREAM}/v1/chat", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            json.load(response)
            self.funnel_feedback(response.headers, status=response.status)  # the rate climbs
    except urllib.error.HTTPError as error:
        # a 429: the rate drops, the funnel holds a second, this call is deferred (no return)
        self.funnel_feedback(error.headers, status=error.code)
        raise
    return n


def halve(upstream: MeteredUpstream, done: dict[str, float]) -> None:
    """Halve the upstream's request limit ``HALVE_AFTER`` seconds after its first call."""
    while not upstream.calls:
        time.sleep(0.01)
    time.sleep(max(upstream.calls[0][0] + HALVE_AFTER - time.time(), 0.0))
    upstream.set_limit("requests", AFTER, BURST_AFTER)
    done["halved_at"] = time.time()


def adaptive_rate() -> float | None:
    """The adaptive rate in force now (requests/s; None: at its max or not adaptive)."""
    rates = list(control.adaptive_rates(app).values())
    return rates[0] if rates else None


def summary(upstream: MeteredUpstream, halved_at: float) -> dict[str, Any]:
    """What the upstream saw around the halving."""
    calls = list(upstream.calls)
    refused = [at for at, _n, status, _used in calls if status == 429]
    last = max(refused, default=halved_at)
    ok = [at for at, _n, status, _used in calls if status == 200]
    before = [at for at in ok if at < halved_at]
    after = [at for at in ok if at > last]
    return {
        "halved_at": halved_at, "refused": len(refused),
        "refused_after_halving": sum(at >= halved_at for at in refused),
        "last_429_after": last - halved_at if refused else None,
        "ok_after_last_429": len(after),
        "rate_before": (len(before) - 1) / (before[-1] - before[0]) if len(before) > 1 else 0.0,
        "rate_after": (len(after) - 1) / (after[-1] - after[0]) if len(after) > 1 else 0.0,
        "adaptive_rate": adaptive_rate(), "adaptive": ADAPTIVE, "log": calls,
    }  # fmt: skip


def produce(upstream: MeteredUpstream) -> None:
    done: dict[str, float] = {}
    halver = threading.Thread(target=halve, args=(upstream, done), daemon=True)
    halver.start()
    results = [chat.delay(n) for n in range(CALLS)]
    answers = [r.get(timeout=300) for r in results]
    halver.join(timeout=60)
    seen = summary(upstream, done["halved_at"])
    last = seen["last_429_after"]
    print(
        f"{CALLS} calls, {seen['refused']} refused (429), {seen['refused_after_halving']} after"
        f" the halving, the last {'-' if last is None else f'{last:.1f}'} s after it;"
        f" {seen['rate_before']:.1f} calls/s before, {seen['rate_after']:.1f}/s after the"
        f" last 429 ({seen['ok_after_last_429']} calls)"
    )
    if os.environ.get("LLM_SUMMARY"):
        with open(os.environ["LLM_SUMMARY"], "w") as out:
            json.dump(seen, out)
    accepted = sorted(n for _at, n, status, _used in upstream.calls if status == 200)
    check(accepted == list(range(CALLS)), "every call reached the upstream once with a 200")
    check(answers == list(range(CALLS)), "every task returned its own answer")
    if ADAPTIVE:
        check(seen["refused_after_halving"] > 0, "the halving drew 429s")
        check(seen["ok_after_last_429"] >= 80, "then the 429s stopped (80 calls and more)")


if __name__ == "__main__":
    if "REDIS_URL" in os.environ and "UPSTREAM_URL" not in os.environ:
        quiet = MeteredUpstream(
            requests=BEFORE, request_burst=BURST_BEFORE, tokens=1e9, token_burst=1e9, publish=False
        )
        with quiet as fake:
            # the workers (started by run) read the upstream's address from the environment
            os.environ["UPSTREAM_URL"] = UPSTREAM = fake.url
            run(lambda: produce(fake), "-c", "4", "-P", "prefork")
    else:
        run(lambda: None)
