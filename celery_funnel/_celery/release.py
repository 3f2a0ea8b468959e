"""The release publisher: publish a parked task's entry as it was captured, with its
copy's token (a due entry the releaser claimed, ``_celery.releaser``; a waiter handed
a seat, ``_celery.concurrency_renewal``, with the seats promised to it), through the
gate's producers (``_shared.publish``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .._shared.publish import PUBLISH_TIMEOUT_SECONDS, producer
from .._shared.state import State, put_state
from .._stores.concurrency import ConcurrencyFunnel
from .._stores.park import Release

__all__ = ["publish"]


def publish(app: Any, release: Release, promised: Sequence[ConcurrencyFunnel] = ()) -> None:
    """Publish a claimed entry as it was captured, with the release token added (and
    the seats ``promised`` to a waiter handed them).

    Raises:
        Exception: what the broker's publish raises.
    """
    message = release.message
    headers = dict(message["headers"])
    put_state(headers, State.from_headers(headers).released(release.token, promised))
    properties = dict(message["properties"])
    delivery_mode = properties.pop("delivery_mode", None)
    expiration = properties.pop("expiration", None)  # a message TTL (ms, from expires)
    if expiration is not None:  # what is left of it after the time parked
        parked_for = time.time() - float(message["meta"]["parked_at"])
        expiration = max(float(expiration) / 1000 - parked_for, 0.001)
    queues = app.amqp.queues
    declare = [queues[name] for name in message["declare"] if name in queues]
    with producer(app) as confirmed:
        confirmed.publish(
            message["body"], exchange=message["exchange"], routing_key=message["routing_key"],
            headers=headers, content_type=message["content_type"],
            content_encoding=message["content_encoding"], priority=message["priority"],
            delivery_mode=delivery_mode, expiration=expiration, declare=declare, retry=True,
            retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
            confirm_timeout=PUBLISH_TIMEOUT_SECONDS, **properties,
        )  # fmt: skip
