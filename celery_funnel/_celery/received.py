"""One ``task-received`` event per task, as Celery users count them; and the receipt
time of every message, which the gate's deadlines count from (``_shared.delivery``).

A task the gate parks or publishes again comes back as a new broker message, and
Celery's strategy (``celery.worker.strategy.default``) sends ``task-received`` for
every message it is handed: Flower's "Processed", ``State.task_count`` and Flower's
prefetch gauge counted a deferred task twice or more. A message that carries the
gate's header (``_shared.state.HEADER``) was published by a gate (the gate's header
belongs only to the messages it published: ``_celery.outgoing``), so it is the same
task received again: its ``task-received`` is not sent. Everything else about it is
Celery's (the log line, the ``task_received`` signal, ``task-revoked`` for an expired
or revoked one, which the strategy sends before).

The strategy keeps the event dispatcher's ``send`` it was built with, so the filter is
put on each new dispatcher (one per broker connection) just before the consumer builds
its strategies, and each strategy is wrapped to name the message it handles.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._shared.delivery import RECEIVED_AT
from .._shared.state import carries_state

__all__ = ["ReceivedOnce"]

RECEIVED = "task-received"


class ReceivedOnce:
    """Installs itself on ``consumer``: wraps ``update_strategies`` (called by Celery's
    ``Tasks`` bootstep at each connection) so that the strategies it builds stamp each
    message with its receipt time and send no ``task-received`` for a task the gate
    published again."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.returning: str | None = None  # the id of the returning task being received
        self._update: Callable[[], None] = consumer.update_strategies
        consumer.update_strategies = self.update_strategies

    def update_strategies(self) -> None:
        dispatcher = self.consumer.event_dispatcher
        if dispatcher is not None and not getattr(dispatcher, "celery_funnel_once", False):
            dispatcher.send = self._filtered(dispatcher.send)
            dispatcher.celery_funnel_once = True
        self._update()
        strategies = self.consumer.strategies
        for name, strategy in list(strategies.items()):
            strategies[name] = self._named(strategy)

    def _filtered(self, send: Callable[..., Any]) -> Callable[..., Any]:
        def filtered(type_: str, *args: Any, **fields: Any) -> Any:
            returning = self.returning
            if returning is not None and type_ == RECEIVED and fields.get("uuid") == returning:
                return None
            return send(type_, *args, **fields)

        return filtered

    def _named(self, strategy: Callable[..., Any]) -> Callable[..., Any]:
        def named(message: Any, *args: Any, **kwargs: Any) -> Any:
            # the broker counts its redelivery limit from now (an ETA message included)
            setattr(message, RECEIVED_AT, time.monotonic())
            headers = getattr(message, "headers", None) or {}
            if not carries_state(headers):  # most messages: a task's first delivery
                return strategy(message, *args, **kwargs)
            self.returning = headers.get("id")
            try:
                return strategy(message, *args, **kwargs)
            finally:
                self.returning = None

        return named
