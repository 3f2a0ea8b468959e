"""An upstream API that answers 429 with Retry-After: its refusals feed the funnel.

    python examples/upstream_429.py

The upstream (a small HTTP server started here) allows 5 requests per fixed second and
answers 429 past that. Our funnel is set a little too generous (8/s). When a task gets
a 429 it calls ``self.funnel_backoff(retry_after)``: every worker's funnel for the task
is held until then, and the task is deferred to that moment, so the whole cluster backs
off at once instead of each task finding out for itself.
"""

from __future__ import annotations

import http.server
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from _harness import check, redis_url, run
from celery import Celery

from celery_funnel import FunnelTask, install

app = install(Celery("upstream_429", broker=redis_url(), backend=redis_url()))
app.conf.funnel_redis_url = redis_url()
UPSTREAM = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:0")


@app.task(bind=True, base=FunnelTask, funnel_rate="8/s", funnel_capacity=1)
def call_api(self: Any, n: int) -> int:
    try:
        with urllib.request.urlopen(f"{UPSTREAM}/item/{n}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        if error.code != 429:
            raise
        self.funnel_backoff(float(error.headers.get("Retry-After", "1")))
        raise  # not reached: funnel_backoff defers the task


class Upstream(http.server.BaseHTTPRequestHandler):
    """5 requests per fixed second, then 429 with the seconds left as Retry-After."""

    lock, window, used, refused = threading.Lock(), 0, 0, 0

    def do_GET(self) -> None:
        cls, now = type(self), time.time()
        with cls.lock:
            if int(now) != cls.window:
                cls.window, cls.used = int(now), 0
            allowed = cls.used < 5
            cls.used += allowed
            cls.refused += not allowed
        self.send_response(200 if allowed else 429)
        if not allowed:
            self.send_header("Retry-After", f"{int(now) + 1 - now:.3f}")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def produce() -> None:
    statuses = [r.get(timeout=90) for r in [call_api.delay(n) for n in range(30)]]
    check(statuses == [200] * 30, "all 30 calls succeeded in the end")
    print(f"upstream refused {Upstream.refused} requests with 429")
    check(Upstream.refused < 10, "the funnel backed off instead of hammering the upstream")


if __name__ == "__main__":
    if "REDIS_URL" in os.environ and "UPSTREAM_URL" not in os.environ:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        # the workers (started by run) read the upstream's address from the environment
        os.environ["UPSTREAM_URL"] = UPSTREAM = f"http://127.0.0.1:{server.server_port}"
    run(produce)
