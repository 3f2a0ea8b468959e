"""A web endpoint limited per client: 429 with Retry-After and the IETF RateLimit headers.

    python examples/web_limit.py

A Starlette app (FastAPI is Starlette underneath: the same handler is a FastAPI route)
answers ``GET /items/{client}``. Each client may make 5 requests back to back, then 5 a
second: an ``AsyncRedisFunnel`` decides each request in one round trip, on the Redis
server's clock, so every web process shares the limit (and so would a Celery task or a
``Funnel.limit`` function using the same funnel name). A refused request gets 429 with
``Retry-After``; every answer carries ``RateLimit-Policy`` and ``RateLimit`` (the IETF
httpapi draft's fields: quota ``q`` per window ``w`` seconds; ``r`` remaining, ``t``
seconds until the funnel is empty again).

Run alone, it serves the app with uvicorn on a free port, calls it with httpx as two
clients, and checks the answers.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from _harness import check, redis_url, run
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from celery_funnel import AsyncRedisFunnel, Rate
from celery_funnel.testing import free_port

RATE, CAPACITY = Rate.parse("5/s"), 5
POLICY = f'"per-client";q={CAPACITY};w={RATE.period * CAPACITY / RATE.count:g}'
FUNNEL = AsyncRedisFunnel.from_url(redis_url())


def funnel_key(client: str) -> str:
    """The client's funnel, in the package's key layout (``funnel:{<name>:<part>}``)."""
    return f"funnel:{{api.items:{client}}}"


async def items(request: Request) -> JSONResponse:
    client = request.path_params["client"]
    decision = await FUNNEL.throttle(funnel_key(client), CAPACITY - 1, RATE.count, RATE.period)
    headers = {
        "RateLimit-Policy": POLICY,
        "RateLimit": f'"per-client";r={decision.remaining};t={math.ceil(decision.reset_after)}',
    }
    if decision.limited:
        headers["Retry-After"] = str(max(1, math.ceil(decision.retry_after)))
        body = {"error": "too many requests", "retry_after": decision.retry_after}
        return JSONResponse(body, status_code=429, headers=headers)
    return JSONResponse({"client": client, "items": []}, headers=headers)


@asynccontextmanager
async def lifespan(_: Starlette) -> AsyncIterator[None]:
    yield
    await FUNNEL.aclose()


app = Starlette(routes=[Route("/items/{client}", items)], lifespan=lifespan)


def produce() -> None:
    """Serve the app, call it as two clients, check what they were answered."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:  # poll until it listens
        if time.monotonic() > deadline or not thread.is_alive():
            raise SystemExit("FAILED: uvicorn did not start")
        time.sleep(0.02)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as web:
            burst = [web.get("/items/alice") for _ in range(8)]
            other = web.get("/items/bob")
            refused = [r for r in burst if r.status_code == 429]
            wait = max((int(r.headers["Retry-After"]) for r in refused), default=0)
            time.sleep(wait)  # what a well-behaved client does with Retry-After
            again = web.get("/items/alice")
    finally:
        server.should_exit = True
        thread.join(10)
    codes = [r.status_code for r in burst]
    print(f"alice, 8 at once: {codes}; bob: {other.status_code}; alice after"
          f" Retry-After ({wait} s): {again.status_code}")  # fmt: skip
    shown = {k: refused[0].headers[k] for k in HEADERS} if refused else {}
    print(f"a refusal's headers: {shown}")
    check(
        codes[:CAPACITY] == [200] * CAPACITY and len(refused) >= 2,
        "the first 5 pass, the rest of the burst gets 429",
    )
    check(
        all(r.headers["RateLimit"].startswith('"per-client";r=0;') for r in refused)
        and all(int(r.headers["Retry-After"]) >= 1 for r in refused)
        and all(r.headers["RateLimit-Policy"] == POLICY for r in burst),
        "429s carry Retry-After and RateLimit r=0; every answer its policy",
    )
    check(other.status_code == 200 and again.status_code == 200, "bob is apart; alice waits")


HEADERS = ("Retry-After", "RateLimit", "RateLimit-Policy")

if __name__ == "__main__":
    os.environ.setdefault("EXAMPLE_WORKERS", "0")  # no Celery worker: a web app only
    run(produce)
