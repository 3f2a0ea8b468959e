"""``MeteredUpstream``: a local fake LLM API, metered as the real ones are, for tests,
examples and benchmarks of token budgets.

It keeps two token buckets, requests and tokens (a level that refills continuously up
to its capacity), answers ``POST /v1/chat`` with the tokens the call really used in its
body (``usage.total_tokens``) and OpenAI-style ``x-ratelimit-*`` headers, and a 429
(with ``Retry-After``) when a bucket cannot pay: one request, and the tokens the call
uses, taken when it arrives. The tokens a call uses are known only to the upstream:
``50 + (n * 37) % 201`` for the call's ``n`` (50 to 250, 150 on average over 201 calls).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MeteredUpstream", "go_duration", "tokens_of"]


def tokens_of(n: int) -> int:
    """The tokens call ``n`` uses: 50 to 250, spread evenly."""
    return 50 + (n * 37) % 201


def go_duration(seconds: float) -> str:
    """A duration as OpenAI's headers write one: ``"20ms"``, ``"1.5s"``, ``"6m0s"``."""
    if seconds < 1:
        return f"{max(round(seconds * 1000), 0)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


@dataclass
class _Bucket:
    rate: float  # units per second
    capacity: float
    level: float = 0.0  # may dip below 0 (the slack): full at the first call, not then
    at: float = 0.0
    started: bool = False

    def refill(self, now: float) -> float:
        if not self.started:
            self.level, self.at, self.started = self.capacity, now, True
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now
        return self.level

    def reset_after(self) -> float:
        """Seconds until the bucket is full again."""
        return (self.capacity - self.level) / self.rate


@dataclass
class MeteredUpstream:
    """A fake LLM API on ``127.0.0.1`` (``url`` once started): ``requests`` per second
    with a bucket of ``request_burst``, ``tokens`` per second with a bucket of
    ``token_burst``; each answer takes ``latency`` seconds. A call is paid for when
    the buckets hold its units within ``slack`` seconds of its arrival: a client
    whose limits equal the upstream's is not refused for arriving a few
    milliseconds early (the time from its admission to the call's arrival varies
    by that much from call to call). ``calls`` records every answered call: (time,
    n, status, tokens used); ``refusals`` every 429: (time, n, the bucket that
    could not pay, its level). With ``publish=False`` it sends no rate-limit header at
    all, not even ``Retry-After`` on a 429 (an upstream that publishes nothing)."""

    requests: float = 10.0
    request_burst: float = 5.0
    tokens: float = 300.0
    token_burst: float = 1500.0
    latency: float = 0.05
    slack: float = 0.01
    publish: bool = True
    calls: list[tuple[float, int, int, int]] = field(default_factory=list)
    refusals: list[tuple[float, int, str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets = {
            "requests": _Bucket(self.requests, self.request_burst),
            "tokens": _Bucket(self.tokens, self.token_burst),
        }
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() it first"
        return f"http://127.0.0.1:{self._server.server_port}"

    def set_tokens(self, rate: float, burst: float) -> None:
        """Change the token limit at once, telling no one (a provider's silent change)."""
        self.set_limit("tokens", rate, burst)

    def set_limit(self, name: str, rate: float, burst: float) -> None:
        """Change limit ``name`` (``"requests"`` or ``"tokens"``) at once, telling no one."""
        with self._lock:
            bucket = self._buckets[name]
            bucket.refill(time.time())
            bucket.rate, bucket.capacity = rate, burst
            bucket.level = min(bucket.level, burst)

    def admit(self, n: int, now: float) -> tuple[int, dict[str, str]]:
        """Meter call ``n`` arriving at ``now``: its status and rate-limit headers."""
        used = tokens_of(n)
        with self._lock:
            requests, tokens = self._buckets["requests"], self._buckets["tokens"]
            requests.refill(now), tokens.refill(now)
            fits = (
                requests.level + requests.rate * self.slack >= 1
                and tokens.level + tokens.rate * self.slack >= used
            )
            if fits:
                requests.level -= 1
                tokens.level -= used
            headers = self._headers(requests, tokens) if self.publish else {}
            if not fits:
                short = "tokens" if requests.level + requests.rate * self.slack >= 1 else "requests"
                self.refusals.append((now, n, short, self._buckets[short].level))
                wait = max(
                    (1 - requests.level) / requests.rate, (used - tokens.level) / tokens.rate
                )
                if self.publish:
                    headers["retry-after"] = f"{max(wait, 0.001):.3f}"
            self.calls.append((now, n, 200 if fits else 429, used if fits else 0))
        return (200 if fits else 429), headers

    @staticmethod
    def _headers(requests: _Bucket, tokens: _Bucket) -> dict[str, str]:
        out = {}
        for name, bucket in (("requests", requests), ("tokens", tokens)):
            out[f"x-ratelimit-limit-{name}"] = str(int(bucket.capacity))
            out[f"x-ratelimit-remaining-{name}"] = str(max(int(bucket.level), 0))
            out[f"x-ratelimit-reset-{name}"] = go_duration(bucket.reset_after())
        return out

    def start(self) -> MeteredUpstream:
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)))
                n = int(body.get("n", 0))
                status, headers = upstream.admit(n, time.time())
                time.sleep(upstream.latency)
                reply: dict[str, Any] = {"error": "rate_limit_exceeded"}
                if status == 200:
                    reply = {"n": n, "usage": {"total_tokens": tokens_of(n)}}
                data = json.dumps(reply).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> MeteredUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> dict[str, float]:
        """What the upstream saw: calls answered 200 and 429, tokens used, the span of
        the accepted calls (first to last, seconds), tokens per second over it, and
        ``used_of_rate``: the share of what the upstream could have served in that span
        beyond its first full bucket, ``(tokens - token_burst) / (rate * span)``."""
        with self._lock:
            calls = list(self.calls)
        ok = [c for c in calls if c[2] == 200]
        used = sum(c[3] for c in ok)
        span = (ok[-1][0] - ok[0][0]) if len(ok) > 1 else 0.0
        return {
            "ok": len(ok), "refused": len(calls) - len(ok), "tokens": used, "span": span,
            "tokens_per_second": used / span if span else 0.0,
            "used_of_rate": (used - self.token_burst) / (self.tokens * span) if span else 0.0,
        }  # fmt: skip
