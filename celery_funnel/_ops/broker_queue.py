"""A task still in the broker (``celery funnel why``): on a Redis broker, its message in
a queue's lists (kombu's: one per priority step) or in the transport's un-acked hash;
elsewhere (RabbitMQ: a queue cannot be read without taking its messages), how many
messages wait in the app's queues, so that an empty queue rules it out.

Reads only: LRANGE and HSCAN, at most ``SEARCH_MAX`` messages in all."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["SEARCH_MAX", "InBroker", "in_broker"]

SEARCH_MAX = 100_000  # messages read at most (a longer queue is searched that far)
PAGE = 1000


@dataclass(frozen=True)
class InBroker:
    """Where a task id was found in the broker: ``place`` ("queue": waiting in
    ``queue``; "unacked": delivered to a worker that has not acked it), or None, with
    what was searched: ``searched`` messages (None: the broker cannot be searched),
    ``waiting``: messages waiting per queue (None when not known), ``complete``:
    whether every message was read."""

    place: str | None
    queue: str | None
    searched: int | None
    waiting: dict[str, int] | None
    complete: bool = True


def _queues(app: Any) -> list[str]:
    names = [str(name) for name in app.amqp.queues]
    default = app.conf.task_default_queue
    return list(dict.fromkeys([*names, *([default] if default else [])]))


def _is(raw: bytes | str, task_id: str) -> bool:
    """Whether the message ``raw`` (kombu's JSON envelope) is task ``task_id``'s."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    if task_id not in text:  # most messages: no parse
        return False
    try:
        found = json.loads(text)
    except ValueError:
        return False
    if isinstance(found, list):  # the un-acked hash: [payload, exchange, routing key]
        found = found[0] if found else {}
    return isinstance(found, dict) and (found.get("headers") or {}).get("id") == task_id


def _redis(app: Any, channel: Any, task_id: str) -> InBroker:
    client, budget, waiting = channel.client, SEARCH_MAX, {}
    # kombu's client prefixes the commands kombu sends (LLEN, HSET...), not LRANGE or
    # HSCAN: those take the transport's global_keyprefix here
    prefix = getattr(channel, "global_keyprefix", "") or ""
    for queue in _queues(app):
        lists = [channel._q_for_pri(queue, pri) for pri in channel.priority_steps]
        waiting[queue] = sum(int(client.llen(key)) for key in dict.fromkeys(lists))
        for key in dict.fromkeys(lists):
            start = 0
            while budget > 0:
                page = client.lrange(prefix + key, start, start + min(PAGE, budget) - 1)
                if not page:
                    break
                if any(_is(raw, task_id) for raw in page):
                    return InBroker("queue", queue, SEARCH_MAX - budget, waiting)
                start, budget = start + len(page), budget - len(page)
    for _, raw in client.hscan_iter(prefix + channel.unacked_key, count=PAGE):
        budget -= 1
        if _is(raw, task_id):
            return InBroker("unacked", None, SEARCH_MAX - budget, waiting)
        if budget <= 0:
            break
    return InBroker(None, None, SEARCH_MAX - budget, waiting, complete=budget > 0)


def _counted(app: Any, connection: Any) -> InBroker:
    waiting, channel = {}, connection.channel()
    try:
        for queue in _queues(app):
            try:
                declared = channel.queue_declare(queue=queue, passive=True)
            except Exception:  # not declared: nothing waits there (the channel closed)
                channel.close()
                channel = connection.channel()
                continue
            waiting[queue] = int(declared.message_count)
    finally:
        channel.close()
    return InBroker(None, None, None, waiting)


def in_broker(app: Any, task_id: str) -> InBroker:
    """Task ``task_id`` among the messages the broker of ``app`` holds.

    Raises:
        Exception: what the broker's client raises.
    """
    with app.connection_for_read() as connection:
        if connection.transport.driver_type == "redis":
            return _redis(app, connection.default_channel, task_id)
        return _counted(app, connection)
