"""The release publisher: publish a parked task's entry as it was captured, with its
copy's token (a due entry the releaser claimed, ``_celery.releaser``; a waiter handed
a seat, ``_celery.concurrency_renewal``, with the seats promised to it), through the
gate's producers (``_shared.publish``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .._shared.publish import publish_message
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
    # a message TTL (from ``expires``) keeps what is left of it after the time parked
    parked_for = time.time() - float(message["meta"]["parked_at"])
    publish_message(app, message, headers, parked_for)
