"""The release publisher: publish a parked task's entry as it was captured, with its
copy's token (a due entry the releaser claimed, ``_celery.releaser``; a waiter handed
a seat, ``_celery.renewal``), through the gate's producers (``_gate.publish``)."""

from __future__ import annotations

import time
from typing import Any

from .._gate.publish import publish_message
from .._gate.state import HEADER
from .._stores.park import Release

__all__ = ["publish"]


def publish(app: Any, release: Release) -> None:
    """Publish a claimed entry as it was captured, with the release token added.

    Raises:
        Exception: what the broker's publish raises.
    """
    message = release.message
    headers = dict(message["headers"])
    headers[HEADER] = {**(headers.get(HEADER) or {}), "release": release.token}
    # a message TTL (from ``expires``) keeps what is left of it after the time parked
    parked_for = time.time() - float(message["meta"]["parked_at"])
    publish_message(app, message, headers, parked_for)
