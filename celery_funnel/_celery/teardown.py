"""A broker connection that died is torn down without taking the worker with it.

When the broker goes away, Celery's consumer ``collect()``s the dead connection, then
``close()``s it. On kombu 5.7's Redis transport, ``collect()`` closes the consumer's
channel and detaches the transport (``transport.client = None``). A channel closed while
its ``BRPOP`` is pending first reads that reply: the read fails (the server is gone),
``collect()`` ignores the error, and the channel is left open, its un-acked messages not
given back. ``close()`` then closes it again, and giving them back now needs the detached
transport's URL: ``AttributeError: 'NoneType' object has no attribute 'hostname'``, no
connection error, so Celery logs "Unrecoverable error" and the worker exits.

A ``BRPOP`` is pending while messages are un-acked in a worker that holds tasks outside
its prefetch window: the tasks the gate holds, and Celery's own ETA tasks (a plain Celery
worker holding countdown tasks exits the same way). So each connection the consumer makes
closes that channel once more, just before ``collect()`` does, with the transport still
attached: the second close gives the messages back (or fails with a connection error
while the broker is down; the broker then restores them after its visibility timeout).

Before anything of the dead connection is torn down, ``LostConnection`` lets the gate
record the runs whose messages the broker will give again (``_shared.copies.CopyGuard.
runs_cut``): started from messages not acked yet (the teardown gives them back at once
on kombu's Redis transport), or acked lately where acks are not confirmed (AMQP).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

__all__ = ["CloseBeforeCollect", "LostConnection"]

logger = logging.getLogger("celery_funnel")


class CloseBeforeCollect:
    """Installs itself on ``consumer``: wraps ``connect`` (called by Celery's
    ``Connection`` bootstep at each connection) so that each broker connection it
    returns closes its channel before it is collected."""

    def __init__(self, consumer: Any) -> None:
        self._connect: Callable[[], Any] = consumer.connect
        consumer.connect = self.connect

    def connect(self) -> Any:
        connection = self._connect()
        # a transport with its own _collect (amqp) closes no channel there: left alone
        if not hasattr(connection.transport, "_collect"):
            connection.collect = self._collecting(connection, connection.collect)
        return connection

    @staticmethod
    def _collecting(connection: Any, collect: Callable[..., Any]) -> Callable[..., Any]:
        def collect_closed(socket_timeout: float | None = None) -> Any:
            channel = connection._default_channel  # the consumer's: its un-acked messages
            if channel is not None:
                previous = socket.getdefaulttimeout()
                socket.setdefaulttimeout(socket_timeout)  # as collect() bounds its close
                try:
                    connection.maybe_close_channel(channel)  # ignores connection errors
                except Exception as error:  # collect() closes it again, as it would
                    logger.debug("celery-funnel: closing the broker channel: %r", error)
                finally:
                    socket.setdefaulttimeout(previous)
            return collect(socket_timeout=socket_timeout)

        return collect_closed


class LostConnection:
    """Installs itself on ``consumer``: wraps ``on_connection_error_after_connected``
    (Celery calls it first when the broker connection dies, before it tears the
    connection down) so that ``on_lost()`` runs before anything else."""

    def __init__(self, consumer: Any, on_lost: Callable[[], None]) -> None:
        self._handle: Callable[[BaseException], Any] = consumer.on_connection_error_after_connected
        self.on_lost = on_lost
        consumer.on_connection_error_after_connected = self.lost

    def lost(self, error: BaseException) -> Any:
        try:
            self.on_lost()
        except Exception as failure:  # never in the way of the reconnection
            logger.warning("celery-funnel: recording the runs cut off: %r", failure)
        return self._handle(error)
