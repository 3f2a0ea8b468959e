"""Publishing a deferred task again, exactly as it was sent, for a later time.

``Task.signature_from_request`` keeps the id, root/parent ids, group and chord, chain,
links, headers, stamps, priority, routing, ``expires``, time limits and ``reply_to``; it
does not keep the serializer, the compression or ``argsrepr``/``kwargsrepr`` (a
secret hidden from events and Flower would show after the first deferral). Both gates
publish through ``republish``, which adds them.

Trace context: where OpenTelemetry instruments the publishing process (its Celery
instrumentation opens a span in ``before_task_publish`` under the current context and
writes ``traceparent`` into the message), the gate publishes under the context carried
by the original message: the new span is a child in the producer's trace, not a new
root, and the run stays in the trace its producer started.
"""

from __future__ import annotations

import contextvars
import importlib
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from kombu.pools import ProducerPool
from kombu.serialization import registry

from .._stores.park import ParkStore, capture
from .state import put_state, send_mark

__all__ = [
    "PUBLISH_TIMEOUT_SECONDS", "gate_publishes", "gate_publishing", "message_options",
    "origin", "park", "producer", "publish_message", "republish",
]  # fmt: skip

# per thread (and per greenlet where contextvars are): a pool thread's run publishing
# does not see the gate's flag of the consumer's thread
_FLAG: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "celery_funnel_gate_publishes", default=False
)


@contextmanager
def gate_publishing() -> Iterator[None]:
    """Messages published in this block (this thread) are the gate's: they keep the
    header it wrote, also inside a run (``FunnelTask`` defers from ``before_start``)."""
    token = _FLAG.set(True)
    try:
        yield
    finally:
        _FLAG.reset(token)


def gate_publishes() -> bool:
    """Whether the gate is publishing, here and now."""
    return _FLAG.get()


@contextmanager
def _traced(context: Any) -> Iterator[None]:
    """The trace context the message of ``context`` carries (its ``traceparent``
    header), current in this block, when OpenTelemetry is installed."""
    try:
        otel = importlib.import_module("opentelemetry.context")
        propagate = importlib.import_module("opentelemetry.propagate")
    except ImportError:  # not installed: nothing traces the publish
        yield
        return
    carrier = {**vars(context), **(getattr(context, "headers", None) or {})}
    token = otel.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        otel.detach(token)


# what a message's headers may carry that is not the task's own (RabbitMQ's dead-letter
# bookkeeping is dropped by Celery already)
_NOT_CARRIED = ("compression",)


def message_options(
    context: Any, content_type: str | None, content_encoding: str | None
) -> dict[str, Any]:
    """The publish options a message was sent with that ``signature_from_request``
    forgets: serializer (from its content type), compression, argsrepr/kwargsrepr."""
    options: dict[str, Any] = {}
    if content_type:
        name = registry.type_to_name.get(content_type)
        if name is not None:
            options["serializer"] = name
    compression = getattr(context, "compression", None)
    if compression:
        options["compression"] = compression  # kombu takes the content type as well
    for field in ("argsrepr", "kwargsrepr"):
        value = getattr(context, field, None)
        if value is not None:
            options[field] = value
    return options


def _ignore_result(task: Any, context: Any) -> bool:
    """The run's own ``ignore_result`` when its message set one, else the task's (what
    Celery 5.4+ calls ``get_actual_ignore_result``; Celery 5.3 has no such function)."""
    own = vars(context).get("ignore_result") if hasattr(context, "__dict__") else None
    return bool(task.ignore_result if own is None else own)


def _signature(
    task: Any,
    context: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    countdown: float | None,
    state: Mapping[str, Any],
    content_type: str | None,
    content_encoding: str | None,
) -> Any:
    """The task's run described by ``context``, to publish again: everything it was
    sent with, ``state`` as the ``celery_funnel`` header."""
    headers = {k: v for k, v in (context.headers or {}).items() if k not in _NOT_CARRIED}
    put_state(headers, dict(state))  # in place of the header it came with
    # Published with ignore_result=True, the header saying what the task was sent with:
    # the worker reads the header, and this publish subscribes to no result (Celery's
    # result consumer would listen for every deferred task in the publishing thread).
    headers["ignore_result"] = _ignore_result(task, context)
    options = message_options(context, content_type, content_encoding)
    return task.signature_from_request(
        context, args, kwargs, countdown=countdown, headers=headers, **options
    )


# a publish that the broker has not confirmed by then failed (the copy may exist: the
# copies' records tell it from the message held, which stays un-acked)
PUBLISH_TIMEOUT_SECONDS = 5.0
_PRODUCERS = "_celery_funnel_producers"
_LOCK = threading.Lock()


def _producers(app: Any) -> ProducerPool:
    """The gate's producers of ``app`` in this process (made on first use): on
    RabbitMQ they publish with publisher confirms."""
    with _LOCK:
        found: tuple[int, ProducerPool] | None = app.__dict__.get(_PRODUCERS)
        if found is None or found[0] != os.getpid():
            connection = app.connection_for_write(transport_options={"confirm_publish": True})
            limit = app.pool.limit
            pool = ProducerPool(  # type: ignore[no-untyped-call]
                connection.Pool(limit), limit=limit, Producer=app.amqp.Producer
            )
            found = (os.getpid(), pool)
            setattr(app, _PRODUCERS, found)
        return found[1]


@contextmanager
def producer(app: Any) -> Iterator[Any]:
    """A producer of ``app``'s broker whose publishes the broker holds when they return:
    on RabbitMQ each waits for the broker's confirmation (at most
    ``PUBLISH_TIMEOUT_SECONDS``), on the Redis transport for Redis's reply. A copy
    of a task is counted as published only then (``_shared.copies``)."""
    with _producers(app).acquire(block=True) as acquired:  # type: ignore[no-untyped-call]
        yield acquired


def close_producers(app: Any) -> None:
    """Close the gate's producer connections of ``app`` in this process, if made."""
    with _LOCK:
        found = app.__dict__.pop(_PRODUCERS, None)
    if found is not None and found[0] == os.getpid():
        found[1].force_close_all()
        found[1].connections.force_close_all()


def republish(
    task: Any,
    context: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    countdown: float,
    state: Mapping[str, Any],
    content_type: str | None = None,
    content_encoding: str | None = None,
) -> None:
    """Publish ``task``'s run described by ``context`` (a Celery ``Context``) again in
    ``countdown`` seconds, with everything it was sent with and ``state`` as the
    ``celery_funnel`` header.

    Raises:
        Exception: what the broker's publish raises (the caller keeps the original
            message un-acked then, so the broker delivers it again).
    """
    signature = _signature(
        task, context, args, kwargs, countdown, state, content_type, content_encoding
    )
    # the header goes with it, also when sent inside a run; traced in the producer's trace.
    # Captured, then published as it is (as a release publishes a parked task): the
    # task was sent once, and Celery would send another ``task-sent`` event for it
    # (Flower counts it sent again, from this worker, after it was received)
    with gate_publishing(), _traced(context):
        message = capture(signature, {}, ignore_result=True, add_to_parent=False)
    publish_message(task.app, message)


def publish_message(
    app: Any, message: Mapping[str, Any], headers: Mapping[str, Any] | None = None,
    elapsed: float = 0.0,
) -> None:  # fmt: skip
    """Publish a captured message (``_stores.park.capture``) as it is, through the
    gate's producers: ``headers`` replace its headers; its message TTL (``expires``),
    if any, is shortened by the ``elapsed`` seconds since it was captured. Once: a
    failed publish is not retried (it may have landed).

    Raises:
        Exception: what the broker's publish raises.
    """
    properties = dict(message["properties"])
    delivery_mode = properties.pop("delivery_mode", None)
    expiration = properties.pop("expiration", None)  # milliseconds
    if expiration is not None:
        expiration = max(float(expiration) / 1000 - elapsed, 0.001)
    queues = app.amqp.queues
    declare = [queues[name] for name in message["declare"] if name in queues]
    with producer(app) as confirmed:
        confirmed.publish(
            message["body"], exchange=message["exchange"], routing_key=message["routing_key"],
            headers=dict(message["headers"] if headers is None else headers),
            content_type=message["content_type"], content_encoding=message["content_encoding"],
            priority=message["priority"], delivery_mode=delivery_mode, expiration=expiration,
            # never retried here: a push that landed and whose reply was lost would
            # go again under the same copy token, and both copies would run; the
            # caller keeps what it moves (the message held, the entry claimed) and
            # tries again later under a new token
            declare=declare, retry=False,
            confirm_timeout=PUBLISH_TIMEOUT_SECONDS, **properties,
        )  # fmt: skip


def park(
    store: ParkStore,
    task: Any,
    context: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    wait: float,
    state: Mapping[str, Any],
    label: str,
    content_type: str | None = None,
    content_encoding: str | None = None,
    backup: tuple[str, float] | None = None,
) -> int | None:
    """Park the run in the funnels' Redis for ``wait`` seconds: the message exactly as
    ``republish`` would publish it (no countdown: it is released when due). Its release
    time (``ParkStore.park``), or None when this copy is stale (its task was released
    and accepted already): drop it. ``backup``: the entry backs up a copy published at
    once (``ParkStore.park``).

    Raises:
        BackendError: when Redis fails (the caller keeps the original message).
    """
    signature = _signature(task, context, args, kwargs, None, state, content_type, content_encoding)
    meta = {
        "task": task.name, "funnel": label,
        "priority": (getattr(context, "delivery_info", None) or {}).get("priority"),
        "parked_at": time.time(),
    }  # fmt: skip
    with gate_publishing(), _traced(context):
        message = capture(signature, meta, ignore_result=True, add_to_parent=False)
    token = str(state.get("release") or "")
    return store.park(str(context.id), wait, message, token, origin(context), backup)


def origin(context: Any) -> str:
    """What every copy of one task message shares, and a later message given the same
    task id does not: its task, the run that sent it, how often it was replaced
    (Celery's ``replace`` gives a chain's last task, or a chord's body, the replaced
    task's id; another run sends it), and the mark of its send (``send_mark``: two
    sends of one id by producers with celery-funnel installed; a message without it
    is told apart by the rest only)."""
    nesting = getattr(context, "replaced_task_nesting", 0) or 0
    found = f"{context.task}\n{context.parent_id or ''}\n{nesting}"
    send = send_mark(context)
    return f"{found}\n{send}" if send else found
