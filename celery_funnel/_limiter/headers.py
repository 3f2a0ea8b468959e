"""Reading an upstream's rate-limit headers (no Celery here): what remains of each of
its limits and until when, and how long it asks us to wait.

Families read (header names are case-insensitive):

- ``Retry-After``: seconds, or an HTTP date (RFC 9110).
- OpenAI style: ``x-ratelimit-remaining-<limit>`` with ``x-ratelimit-reset-<limit>``,
  a Go duration (``6m0s``, ``1s``, ``20ms``): a bucket, full again after the reset.
- Anthropic: ``anthropic-ratelimit-<limit>-remaining`` with ``-reset``, an RFC 3339
  instant (``requests``, ``tokens``, ``input-tokens``, ``output-tokens``): a bucket.
- IETF ``RateLimit`` / ``RateLimit-Policy`` (draft-ietf-httpapi-ratelimit-headers,
  structured fields: ``"default";r=50;t=30``; the policy's ``q``/``w`` are its quota
  and window), and the older ``RateLimit-Remaining`` / ``RateLimit-Reset`` fields: a
  window, ``r`` units left until it resets ``t`` seconds from now.

A limit's name is its family's name with ``-`` written ``_`` (``input-tokens`` ->
``input_tokens``; the IETF policy's own name; ``ratelimit`` for the older fields).
"""

from __future__ import annotations

import datetime
import email.utils
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

__all__ = ["Quota", "Upstream", "backoff_of", "duration", "read_headers"]


class Quota(NamedTuple):
    """What the upstream says remains of one of its limits: ``remaining`` units until
    ``reset`` seconds from now; ``window``: the units come back at once at the reset
    (a window), else they refill steadily and ``reset`` is when the bucket is full."""

    remaining: int
    reset: float
    window: bool = False


class Upstream(NamedTuple):
    """An upstream's rate-limit headers, read: each named limit's ``quotas``, and
    ``retry_after`` (seconds, None when not given)."""

    quotas: dict[str, Quota]
    retry_after: float | None


_GO = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_OPENAI = re.compile(r"x-ratelimit-(remaining|reset)-(.+)")
_ANTHROPIC = re.compile(r"anthropic-ratelimit-(.+)-(remaining|reset)")


def duration(text: str) -> float | None:
    """A Go duration (``6m0s``, ``1.5s``, ``20ms``) or a plain number of seconds, in
    seconds; None when it is neither."""
    text = text.strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    parts = _GO.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _instant(text: str, now: float) -> float | None:
    """Seconds from ``now`` to an RFC 3339 instant or an HTTP date (never below 0)."""
    text = text.strip()
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(when.timestamp() - now, 0.0)


def _count(text: str) -> int | None:
    try:
        return max(int(float(text.strip())), 0)
    except ValueError:
        return None


def _retry_after(text: str | None, now: float) -> float | None:
    if text is None:
        return None
    seconds = duration(text)
    return seconds if seconds is not None else _instant(text, now)


def _pairs(items: Iterable[tuple[str, str]]) -> dict[str, tuple[str | None, str | None]]:
    """Per limit, its (remaining, reset) texts from the OpenAI and Anthropic families."""
    found: dict[str, list[str | None]] = {}
    for name, value in items:
        match = _OPENAI.fullmatch(name)
        if match:
            which, limit = match.groups()
        elif match := _ANTHROPIC.fullmatch(name):
            limit, which = match.groups()
        else:
            continue
        found.setdefault(limit, [None, None])[which == "reset"] = value
    return {limit: (pair[0], pair[1]) for limit, pair in found.items()}


def _members(text: str) -> Iterable[tuple[str, dict[str, str]]]:
    """The members of a structured-field list: ``"name";k=v;k=v, ...``."""
    for member in text.split(","):
        name, *params = [p.strip() for p in member.split(";")]
        if name:
            pairs = (p.split("=", 1) for p in params if "=" in p)
            yield name.strip('"'), {k.strip(): v.strip().strip('"') for k, v in pairs}


def _ietf(fields: Mapping[str, str]) -> dict[str, Quota]:
    quotas: dict[str, Quota] = {}
    for name, params in _members(fields.get("ratelimit", "")):
        remaining, reset = _count(params.get("r", "")), duration(params.get("t", "0"))
        if remaining is not None and reset is not None:
            quotas[name.replace("-", "_")] = Quota(remaining, reset, window=True)
    remaining = _count(fields.get("ratelimit-remaining", ""))
    reset = duration(fields.get("ratelimit-reset", ""))
    if remaining is not None and reset is not None:
        quotas["ratelimit"] = Quota(remaining, reset, window=True)
    return quotas


def read_headers(headers: Any, now: float) -> Upstream:
    """Read a response's rate-limit headers (a mapping, or anything with ``items()``:
    ``http.client.HTTPMessage``, requests' and httpx's headers) at ``now`` (seconds
    since the epoch, for the dates). Values that do not parse are skipped."""
    items = [(str(k).lower(), str(v)) for k, v in headers.items()]
    fields = dict(items)
    quotas = _ietf(fields)
    for limit, (remaining, reset) in _pairs(items).items():
        count = _count(remaining) if remaining is not None else None
        if count is None or reset is None:
            continue
        seconds = duration(reset)
        if seconds is None:
            seconds = _instant(reset, now)
        if seconds is not None:
            quotas[limit.replace("-", "_")] = Quota(count, seconds)
    return Upstream(quotas, _retry_after(fields.get("retry-after"), now))


def backoff_of(upstream: Upstream, default: float = 1.0) -> float:
    """How long a refusal (429) asks us to wait: its ``Retry-After``, else the latest
    reset of a limit with nothing left, else ``default`` seconds."""
    if upstream.retry_after is not None:
        return upstream.retry_after
    spent = [quota.reset for quota in upstream.quotas.values() if quota.remaining == 0]
    return max(spent) if spent else default
