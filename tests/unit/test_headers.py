"""The rate-limit header reader: a table of real header sets from each family (as the
providers document them), durations and dates included, read at a fixed instant."""

from __future__ import annotations

import email.message
from typing import Any

import pytest

from celery_funnel import Quota, Upstream, read_headers
from celery_funnel._limiter.headers import backoff_of, duration

NOW = 1_717_243_200.0  # 2024-06-01T12:00:00Z

ROWS: list[tuple[str, dict[str, str], Upstream]] = [
    ("openai: requests and tokens, Go durations", {
        "x-ratelimit-limit-requests": "60", "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-requests": "59", "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s",
    }, Upstream({"requests": Quota(59, 1.0), "tokens": Quota(149984, 360.0)}, None)),
    ("openai: milliseconds and minutes with fractions, any case", {
        "X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "20ms",
        "x-ratelimit-remaining-tokens": "512", "x-ratelimit-reset-tokens": "1m30.5s",
    }, Upstream({"requests": Quota(0, 0.02), "tokens": Quota(512, 90.5)}, None)),
    ("openai: a 429 with Retry-After in seconds", {
        "retry-after": "2", "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "1.2s",
    }, Upstream({"tokens": Quota(0, 1.2)}, 2.0)),
    ("anthropic: four limits, RFC 3339 resets", {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2024-06-01T12:00:01Z",
        "anthropic-ratelimit-tokens-remaining": "79000",
        "anthropic-ratelimit-tokens-reset": "2024-06-01T12:00:45Z",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
        "anthropic-ratelimit-input-tokens-reset": "2024-06-01T14:00:30+02:00",
        "anthropic-ratelimit-output-tokens-remaining": "8000",
        "anthropic-ratelimit-output-tokens-reset": "2024-06-01T12:00:06.500Z",
    }, Upstream({
        "requests": Quota(49, 1.0), "tokens": Quota(79000, 45.0),
        "input_tokens": Quota(39000, 30.0), "output_tokens": Quota(8000, 6.5),
    }, None)),
    ("anthropic: a 429, Retry-After, a reset already past", {
        "retry-after": "15", "anthropic-ratelimit-output-tokens-remaining": "0",
        "anthropic-ratelimit-output-tokens-reset": "2024-06-01T11:59:59Z",
    }, Upstream({"output_tokens": Quota(0, 0.0)}, 15.0)),
    ("ietf structured fields: two policies", {
        "RateLimit-Policy": '"burst";q=100;w=60, "daily";q=1000;w=86400',
        "RateLimit": '"burst";r=50;t=30, "daily";r=900;t=3600',
    }, Upstream({"burst": Quota(50, 30.0, True), "daily": Quota(900, 3600.0, True)}, None)),
    ("ietf older fields", {
        "RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "50",
    }, Upstream({"ratelimit": Quota(0, 50.0, True)}, None)),
    ("Retry-After as an HTTP date", {
        "Retry-After": "Sat, 01 Jun 2024 12:02:00 GMT",
    }, Upstream({}, 120.0)),
    ("values that do not parse are skipped", {
        "x-ratelimit-remaining-tokens": "many", "x-ratelimit-reset-tokens": "1s",
        "x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "soon",
        "retry-after": "later", "content-type": "application/json",
    }, Upstream({}, None)),
]  # fmt: skip


@pytest.mark.parametrize(("label", "headers", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_header_table(label: str, headers: dict[str, str], expected: Upstream) -> None:
    assert read_headers(headers, NOW) == expected, label


def test_an_http_message_reads_as_a_mapping() -> None:
    message = email.message.Message()  # what urllib's responses carry
    message["x-ratelimit-remaining-tokens"] = "7"
    message["x-ratelimit-reset-tokens"] = "250ms"
    assert read_headers(message, NOW).quotas == {"tokens": Quota(7, 0.25)}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6m0s", 360.0), ("1s", 1.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("0.5", 0.5),
     ("150us", 0.00015), ("", None), ("1x", None), ("s", None)],
)  # fmt: skip
def test_go_durations(text: str, seconds: Any) -> None:
    assert duration(text) == (pytest.approx(seconds) if seconds is not None else None)


def test_a_refusal_waits_for_retry_after_else_the_latest_spent_reset() -> None:
    assert backoff_of(Upstream({"tokens": Quota(0, 3.0)}, 2.0)) == 2.0
    spent = Upstream({"tokens": Quota(0, 3.0), "requests": Quota(0, 0.5), "x": Quota(9, 60)}, None)
    assert backoff_of(spent) == 3.0
    assert backoff_of(Upstream({}, None)) == 1.0
