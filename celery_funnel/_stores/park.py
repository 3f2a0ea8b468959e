"""Parked tasks: deferred messages kept in the funnels' Redis until their release time.

A task deferred for longer than a short threshold is not published again with a long
countdown (which sits un-acked in a worker's memory and must be re-published before the
broker's redelivery limit): its message, exactly as it would have been published, is
written to Redis with its release time, and the broker's copy is acked. Every worker's
releaser (``releaser.py``) claims due entries with a lease, publishes them to their
original exchange and routing key, and forgets them. A releaser that dies mid-release
leaves a lease that runs out; another claims the entry again. Each release carries a
token: the first copy a worker accepts runs, any other copy of the same release is dropped
(``copies``). The entry stays until a worker accepts a copy of its release, so that a
copy lost on its way (its receiving worker killed before the broker recorded the
delivery) is published again once the lease runs out.

Keys (one hash tag, so one script sees them all on a Redis Cluster)::

    <prefix>{~parked}#due          sorted set  task id -> release time (µs)
    <prefix>{~parked}#entries      hash        task id -> message (JSON)
    <prefix>{~parked}#claims       hash        task id -> token of the claiming release
    <prefix>{~parked}#leases       sorted set  task id -> end of the claim (µs)
    <prefix>{~parked}#accepted     hash        task id -> its copies (``copies``);
                                               origins of its messages
    <prefix>{~parked}#accepted-at  sorted set  task id -> when (µs), to expire the above

An entry records its funnel, Celery priority and arrival time beside the message, so
that another release order (by priority, or fair between keys) reads the same entries.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kombu.entity import Queue
from kombu.messaging import Producer

from .._limiter.scripts import RedisClient
from .copies import Copies, busy
from .fair import FairStore
from .store import ParkedStore, text

__all__ = ["ParkStore", "Parked", "Release", "capture"]

US = 1_000_000
PAGE = 500  # entries read per round trip
PAGES = 200  # pages of the release order a listing reads at most


@dataclass(frozen=True)
class Parked:
    """One parked task, as ``ParkStore.entries`` lists it."""

    task_id: str
    release_at: float  # seconds since the epoch, the funnels' Redis clock
    task: str  # the task's name
    funnel: str  # the funnel(s) that deferred it
    priority: int | None
    parked_at: float  # seconds since the epoch


@dataclass(frozen=True)
class Release:
    """A claimed entry: publish ``message`` to release task ``task_id``; ``token``
    marks this release (its copies carry it)."""

    task_id: str
    token: str
    message: dict[str, Any]


class _Capture(Producer):
    """A producer that keeps the messages it is asked to publish instead of sending them:
    the message exactly as Celery would publish it (serialized, compressed, headers,
    properties, exchange, routing key, queues to declare)."""

    def __init__(self, connection: Any) -> None:
        super().__init__(connection, auto_declare=False)  # type: ignore[no-untyped-call]
        self.messages: list[dict[str, Any]] = []

    def _publish(  # kombu's signature
        self, body: bytes, priority: int | None, content_type: str, content_encoding: str,
        headers: dict[str, Any], properties: dict[str, Any], routing_key: str,
        mandatory: bool, immediate: bool, exchange: str, declare: list[Any],
        *args: Any, **kwargs: Any,
    ) -> None:  # fmt: skip
        self.messages.append({
            "body": body if isinstance(body, bytes) else str(body).encode(content_encoding),
            "content_type": content_type, "content_encoding": content_encoding,
            "headers": dict(headers or {}), "properties": dict(properties or {}),
            "priority": priority, "exchange": exchange, "routing_key": routing_key,
            "declare": [e.name for e in declare or () if isinstance(e, Queue)],
        })  # fmt: skip


def capture(signature: Any, meta: Mapping[str, Any], **options: Any) -> dict[str, Any]:
    """The message ``signature.apply_async(**options)`` would publish, without
    publishing it, with ``meta`` (task, funnel, priority, parked_at) beside it.

    Raises:
        RuntimeError: when Celery published no task message.
    """
    with signature.app.connection_for_write() as connection:
        producer = _Capture(connection)
        signature.apply_async(producer=producer, **options)
    # a task-sent event, when enabled, goes through the same producer: keep the task
    found = [m for m in producer.messages if "task" in m["headers"] and "id" in m["headers"]]
    if not found:
        raise RuntimeError(f"no task message was published for {signature!r}")
    return {**found[0], "meta": dict(meta)}


def encode_message(message: Mapping[str, Any]) -> str:
    """A captured message as JSON text (the body base64-encoded)."""
    return json.dumps({**message, "body": base64.b64encode(message["body"]).decode("ascii")})


def decode_message(text: str | bytes) -> dict[str, Any]:
    """The inverse of ``encode_message``."""
    message: dict[str, Any] = json.loads(text)
    message["body"] = base64.b64decode(message["body"])
    return message


class ParkStore(ParkedStore):
    """The parked tasks of one app, in the funnels' Redis (``client``, redis-py), under
    ``prefix`` (``funnel_key_prefix``).

    Raises (every method): ``BackendError`` when Redis fails.
    """

    what = "the parked tasks"

    def __init__(self, client: RedisClient, prefix: str) -> None:
        super().__init__(client, prefix)
        self.copies = Copies(client, prefix)
        self._park, self._claim, self._purge = map(
            self.parked_script, ("park", "park_claim", "park_purge")
        )

    def park(
        self,
        task_id: str,
        wait: float,
        message: Mapping[str, Any],
        token: str,
        origin: str = "",
        backup: tuple[str, float] | None = None,
    ) -> int | None:
        """Park ``message`` (see ``capture``) for ``wait`` seconds from now (the server's
        clock), counted under its ``meta["funnel"]`` label. ``token``: the token of the
        copy parked ("" for the message as first sent). ``origin``: what tells copies
        of one message from another message given the same task id (``copies``).
        ``backup``: (the token of a copy published at once, seconds): the entry is that
        copy's backup, claimed for it for that long and not counted as parked
        (``lua/park.lua``). Returns its release time as the server set it (µs since
        the epoch: what ``postpone`` asks for), or None when that copy is stale
        (another copy was accepted, or the task is parked already): the caller drops
        it.

        Raises:
            CopiesBusyError: another send of ``task_id`` is on its way (keep the message).
        """
        wait_us = max(round(wait * US), 0)
        label = str(message["meta"]["funnel"])
        copy, lease = backup or ("", 0.0)
        reply = self._script(
            self._park, self.keys, task_id, wait_us, encode_message(message), token, label,
            origin, copy, max(round(lease * US), 0),
        )  # fmt: skip
        return int(reply[1]) if busy(task_id, int(reply[0])) else None

    def postpone(self, task_id: str, release: int, wait: float) -> bool:
        """Move the release of parked task ``task_id`` to ``wait`` seconds from now, if
        it is still ``release`` (what ``park`` returned): not made due, booked or
        claimed since. Whether it moved."""
        args = ("postpone", task_id, release, max(round(wait * US), 0))
        return bool(int(self._script(self._purge, self.keys, *args)[0]))

    def claim(
        self, lead: float, lease: float, limit: int, keep: float
    ) -> tuple[float, float, list[Release]]:
        """Claim up to ``limit`` entries due within ``lead`` seconds (and any whose
        copy no worker accepted within its lease) for ``lease`` seconds (twice as long
        at each claim again); forget records of copies settled ``keep`` seconds ago.
        Returns the next release time and the server's time (epoch seconds; the next
        release is -1 when nothing waits), and the claims."""
        token = uuid.uuid4().hex
        args = (round(lead * US), round(lease * US), limit, token, round(keep * US))
        reply = self._script(self._claim, self.keys, *args)
        pairs = zip(reply[2::2], reply[3::2], strict=True)
        releases = [Release(text(i), token, decode_message(m)) for i, m in pairs]
        following = float(reply[0]) / US if int(reply[0]) >= 0 else -1.0
        return following, float(reply[1]) / US, releases

    def accept(self, task_id: str, token: str, *, drop: bool = False) -> bool:
        """A worker received the copy of a release carrying ``token``: True to run it,
        False to drop it (``Copies.accept``)."""
        return self.copies.accept(task_id, token, drop=drop)

    def count(self) -> int:
        """How many tasks are parked (those being released included)."""
        return int(self._method("execute_command", "HLEN", self.keys.entries))

    def counts(self) -> dict[str, int]:
        """How many tasks each funnel label holds parked."""
        raw = self._method("hgetall", self.keys.counts)
        return {text(k): int(v) for k, v in raw.items() if int(v) > 0}

    def entries(self, limit: int = 1000, label: str | None = None) -> list[Parked]:
        """Up to ``limit`` parked tasks (of funnel ``label`` only, when given), the next to
        be released first; at most ``PAGES`` pages of the release order are read."""
        found: list[Parked] = []
        for page in range(PAGES):
            pairs = self._method(
                "zrange", self.keys.due, page * PAGE, (page + 1) * PAGE - 1, withscores=True
            )
            if not pairs:
                break
            texts = self._method(
                "execute_command", "HMGET", self.keys.entries, *[i for i, _ in pairs]
            )
            for (task_id, score), raw in zip(pairs, texts, strict=True):
                if raw is None:
                    continue
                meta = json.loads(raw)["meta"]
                if label is None or meta["funnel"] == label:
                    found.append(Parked(
                        text(task_id), float(score) / US, meta["task"], meta["funnel"],
                        meta.get("priority"), meta["parked_at"],
                    ))  # fmt: skip
                if len(found) >= limit:
                    return found
        return found

    def purge(self, label: str | None = None, *, release: bool = False) -> int:
        """Delete the parked tasks (of funnel ``label`` only, when given): they never run;
        or, with ``release``, make them due now. How many it purged or made due (at most
        ``PAGE * PAGES`` per call)."""
        ids = [p.task_id for p in self.entries(PAGE * PAGES, label)]
        done = self._each_page("release" if release else "purge", ids)
        if not release:  # purged fair-share tasks leave their queues: no slot for them
            fair = FairStore(self.client, self.prefix)
            for start in range(0, len(ids), PAGE):
                fair.forget(ids[start : start + PAGE])
        return done

    def make_due(self, ids: Sequence[str]) -> int:
        """Make the parked tasks among ``ids`` due now (the others are left alone: not
        parked, or being released); how many it made due."""
        return self._each_page("release", list(ids))

    def _each_page(self, action: str, ids: list[str]) -> int:
        return sum(
            int(self._script(self._purge, self.keys, action, *ids[start : start + PAGE])[0])
            for start in range(0, len(ids), PAGE)
        )
