"""One delivery of a message to this worker, as the gate sees it from receipt to ack
(``Delivery``): how long the worker may keep it un-acked, and whether its copy was
accepted.

The broker keeps a delivered message until it is acked, and gives it to another worker
when it deems the first one gone: the Redis transport past its ``visibility_timeout``
(counted from the delivery), RabbitMQ when the channel closes (past
``consumer_timeout``, or a lost connection). A message the gate keeps longer runs twice.
So every delivery has three times, counted from its receipt (stamped where Celery's
consumer first sees the message, before an ETA wait: ``_celery.received``), from the
broker's limit (``CountdownPolicy.limit``) and the countdown cap (``_config.countdown``:
half the limit unless ``funnel_max_countdown`` says otherwise):

- ``hold_until`` = receipt + the cap (at most half the limit): a wait the gate plans (a
  hold on the consumer's timer) ends by then; a longer wait moves the task (parked, or
  published again as a new copy, ``copies``) or hands the message back;
- ``deadline`` = receipt + three quarters of the broker's limit, whatever the cap (a
  message sent with an ETA past a lowered cap still runs at its ETA): no run
  starts from this delivery after it, whatever delayed it (a Redis call that hung, an
  event loop that stalled); the message is handed back to the broker instead
  (``hand_back``). A hand-back is the broker's own requeue, in one call: the Redis
  transport moves the message back to its queue only if it is still un-acked (a
  redelivery that happened meanwhile stays the only copy), RabbitMQ requeues it. No
  second copy appears, so nothing can run twice from it;
- ``hands_off`` = receipt + nine tenths of the broker's limit: on a
  transport that restores messages itself (kombu's Redis transport, past its visibility
  timeout), the message may be with another worker by now, under the same delivery
  tag: acking or rejecting this delivery would ack or requeue that one. Past it the gate
  forgets the delivery here only (``settle_locally``); the broker keeps the message.

A delivery ends acked (``ack``), handed back (``hand_back``), or failed as Celery fails
a task (``fail_request``); ``until_expiry`` tells how long its task has until it expires.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from billiard.einfo import ExceptionInfo  # type: ignore[import-untyped]
from celery import signals as celery_signals
from celery.worker.state import task_ready

from .._config.countdown import SAFETY, CountdownPolicy

__all__ = [
    "DEADLINE", "EXPIRY_MARGIN_SECONDS", "HANDS_OFF", "RECEIVED_AT", "Delivery", "ack",
    "delivery_of", "fail_request", "hand_back", "overdue", "settle_locally", "until_expiry",
]  # fmt: skip

logger = logging.getLogger("celery_funnel")

RECEIVED_AT = "celery_funnel_received"  # the attribute of a kombu message: when it came
DEADLINE = 0.75  # the deadline, in the broker's limits after the receipt
HANDS_OFF = 0.9  # past this (the broker's limits after the receipt), it is not touched
_ATTRIBUTE = "_celery_funnel_delivery"  # the attribute of a Celery Request: its Delivery
# held until its expiry is this much past, so that Celery sees it expired
EXPIRY_MARGIN_SECONDS = 0.01


@dataclass
class Delivery:
    """One delivery: ``received`` (``time.monotonic()`` seconds), whether the broker
    ``redelivered`` it, ``hold_until`` and ``deadline`` (monotonic seconds; see the
    module), and whether its copy was ``accepted`` (checked against the task's copies,
    or needing no check: a message as first sent, delivered once)."""

    received: float
    redelivered: bool
    hold_until: float
    deadline: float
    hands_off: float
    accepted: bool = False

    def hold_left(self, now: float | None = None) -> float:
        """Seconds left for waits the gate plans (never negative)."""
        return max(self.hold_until - (time.monotonic() if now is None else now), 0.0)

    def past_deadline(self, now: float | None = None) -> bool:
        """Whether no run may start from this delivery any more."""
        return (time.monotonic() if now is None else now) >= self.deadline

    def past_hands_off(self, now: float | None = None) -> bool:
        """Whether the broker may have given the message to another worker already."""
        return (time.monotonic() if now is None else now) >= self.hands_off

    def unchecked(self, token: str) -> bool:
        """Whether its copy must be checked before it goes on: it carries a copy's
        ``token``, or the broker delivered it again, and it was not accepted yet."""
        return not self.accepted and (bool(token) or self.redelivered)


def delivery_of(request: Any, countdowns: CountdownPolicy) -> Delivery:
    """The delivery of ``request`` (a Celery worker Request), made on first call from
    its message's receipt (now, when unstamped), under the broker's ``countdowns``."""
    found: Delivery | None = getattr(request, _ATTRIBUTE, None)
    if found is None:
        received = getattr(getattr(request, "message", None), RECEIVED_AT, None)
        start = time.monotonic() if received is None else float(received)
        redelivered = bool((request.delivery_info or {}).get("redelivered"))
        limit = countdowns.limit
        found = Delivery(
            start, redelivered, start + min(countdowns.cap, SAFETY * limit),
            start + DEADLINE * limit, start + HANDS_OFF * limit,
        )  # fmt: skip
        setattr(request, _ATTRIBUTE, found)
    return found


def overdue(request: Any, now: float) -> bool:
    """Whether ``request``'s delivery (if the gate saw it) is past its deadline."""
    found: Delivery | None = getattr(request, _ATTRIBUTE, None)
    return found is not None and found.past_deadline(now)


def ack(request: Any) -> None:
    """Ack ``request``'s message and forget it here. An ack that cannot reach the
    broker (its connection closed meanwhile) is left undone, never raised: the broker
    delivers the message again, and its copy is checked then (``copies``). Past the
    delivery's ``hands_off`` time, settled here only (``settle_locally``)."""
    if not settle_locally(request):
        try:
            request.acknowledge()
        except Exception as error:  # a closed channel: the broker keeps the message
            logger.info(
                "celery-funnel: could not ack task %s[%s] (%r): the broker delivers it again",
                request.name, request.id, error,
            )  # fmt: skip
    task_ready(request)


def hand_back(request: Any, why: str) -> None:
    """Give ``request``'s message back to the broker (requeued, as Celery's
    ``Reject(requeue=True)``) and forget it here: the broker delivers it again, to this
    worker or another. ``why``: for the log line. Never raises: a broker that cannot be
    reached keeps the message un-acked, and delivers it again. Past the delivery's
    ``hands_off`` time the broker restores it itself: settled here only."""
    logger.info(
        "celery-funnel: task %s[%s] handed back to the broker: %s", request.name, request.id, why
    )
    if not settle_locally(request):
        try:
            request.reject(requeue=True)
        except Exception as error:  # a closed channel: the broker keeps the message
            logger.info("celery-funnel: could not hand back task %s[%s] (%r)",
                        request.name, request.id, error)  # fmt: skip
    task_ready(request)


def settle_locally(request: Any) -> bool:
    """Past its ``hands_off`` time, forget ``request``'s delivery in this worker only,
    when its transport restores un-acked messages itself (kombu's virtual transports:
    Redis); True when done so. kombu's Redis transport delivers a restored message
    again under the same delivery tag: an ack or a reject now could settle another
    worker's delivery of it. The tag leaves this channel's prefetch count, untouched on
    the broker, which restores the message (or has already)."""
    found: Delivery | None = getattr(request, _ATTRIBUTE, None)
    message = getattr(request, "message", None)
    qos = getattr(getattr(message, "channel", None), "qos", None)
    delivered = getattr(qos, "_delivered", None)  # kombu's virtual QoS: tag -> message
    if found is None or not found.past_hands_off() or not isinstance(delivered, dict):
        return False
    assert message is not None
    delivered.pop(message.delivery_tag, None)
    request.acknowledged = True  # nothing of Celery's acks it later
    logger.info("celery-funnel: task %s[%s]: its delivery is past what the broker allows;"
                " left to the broker", request.name, request.id)  # fmt: skip
    return True


def fail_request(request: Any, error: BaseException) -> None:
    """Fail ``request`` with ``error`` as Celery fails a task: FAILURE stored (with its
    errbacks), ``task_failure`` sent, the ``task-failed`` event, the message acked."""
    try:
        raise error
    except BaseException:  # only to capture the traceback
        info = ExceptionInfo()
    task = request.task
    task.backend.mark_as_failure(
        request.id, error, info.traceback, request=request._context,
        store_result=request.store_errors,
    )  # fmt: skip
    celery_signals.task_failure.send(
        sender=task, task_id=request.id, exception=error, args=request.args,
        kwargs=request.kwargs, traceback=info.traceback, einfo=info,
    )  # fmt: skip
    request.send_event("task-failed", exception=repr(error), traceback=info.traceback)
    request.acknowledge()
    task_ready(request)


def until_expiry(request: Any) -> float:
    """Seconds until ``request`` expires (a hair past it), or infinity."""
    expires = request.expires
    if expires is None:
        return float("inf")
    now = datetime.now(timezone.utc if expires.tzinfo else None)
    left: float = (expires - now).total_seconds()
    return max(left, 0.0) + EXPIRY_MARGIN_SECONDS
