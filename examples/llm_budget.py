"""Throttling an LLM API: requests and tokens at once, tokens settled after each call.

    python examples/llm_budget.py

The upstream (``celery_funnel.testing.MeteredUpstream``, a local fake LLM API started
here) allows 10 requests/s (a bucket of 5) and 300 tokens/s (a bucket of 1500), charges
the tokens a call really uses (50 to 250, 150 on average) and answers 429 past that,
with OpenAI-style ``x-ratelimit-*`` headers. The task charges its estimate
(``max_tokens``, 250) on the ``tokens`` funnel before the call, and settles the tokens
used after it: the unused part of the estimate is given back at once, to every worker.
Two workers with 4 processes each run 80 calls.

``LLM_SETTLE=0`` runs without settling (the estimate stays charged); ``LLM_SUMMARY``
names a file to write what the upstream saw (JSON), for the test and the benchmark.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from _harness import check, redis_url, run
from celery import Celery

from celery_funnel import FunnelTask, install
from celery_funnel.testing import MeteredUpstream

app = install(Celery("llm_budget", broker=redis_url(), backend=redis_url()))
app.conf.funnel_redis_url = redis_url()
UPSTREAM = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:0")
SETTLE = os.environ.get("LLM_SETTLE", "1") == "1"
MAX_TOKENS = 250  # the estimate: no call uses more
CALLS = 80


@app.task(
    bind=True,
    base=FunnelTask,
    funnel_limits=[
        {"name": "requests", "rate": "10/s", "capacity": 5},
        {"name": "tokens", "rate": "300/s", "capacity": 1500, "cost": MAX_TOKENS},
    ],
)
def chat(self: Any, n: int) -> int:
    body = json.dumps({"n": n, "max_tokens": MAX_TOKENS}).encode()
    request = urllib.request.Request(
        f"{UPSTREAM}/v1/chat", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            used = int(json.load(response)["usage"]["total_tokens"])
            headers = response.headers
    except urllib.error.HTTPError as error:
        # a 429: hold the funnels for its Retry-After, and defer this task (no return)
        self.funnel_feedback(error.headers, status=error.code)
        raise
    if SETTLE:
        self.funnel_settle(tokens=used)  # 250 charged, `used` spent: the rest back now
        # what the upstream says remains (x-ratelimit-remaining-requests|tokens)
        self.funnel_feedback(headers)
    return used


def produce(upstream: MeteredUpstream) -> None:
    results = [chat.delay(n) for n in range(CALLS)]
    used = [r.get(timeout=180) for r in results]
    seen = upstream.summary()
    print(
        f"{seen['ok']} calls, {seen['refused']} refused (429), {seen['tokens']} tokens in"
        f" {seen['span']:.1f} s: {seen['tokens_per_second']:.0f} tokens/s,"
        f" {100 * seen['used_of_rate']:.0f}% of the 300/s the upstream allowed past its bucket"
    )
    if os.environ.get("LLM_SUMMARY"):
        with open(os.environ["LLM_SUMMARY"], "w") as out:
            log = {"refusals": upstream.refusals, "log": upstream.calls}
            json.dump({**seen, "settle": SETTLE, **log}, out)
    check(sorted(c[1] for c in upstream.calls if c[2] == 200) == list(range(CALLS)),
          "every call reached the upstream once")  # fmt: skip
    check(sum(used) == seen["tokens"], "the tokens the tasks saw are the upstream's")
    if SETTLE:
        check(seen["refused"] == 0, "the upstream never answered 429")
        check(seen["used_of_rate"] >= 0.9, "at least 90% of the token rate was used")


if __name__ == "__main__":
    if "REDIS_URL" in os.environ and "UPSTREAM_URL" not in os.environ:
        with MeteredUpstream() as fake:
            # the workers (started by run) read the upstream's address from the environment
            os.environ["UPSTREAM_URL"] = UPSTREAM = fake.url
            run(lambda: produce(fake), "-c", "4", "-P", "prefork")
    else:
        run(lambda: None)
