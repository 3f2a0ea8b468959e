"""Publishing a deferred task again, exactly as it was sent, for a later time.

``Task.signature_from_request`` keeps the id, root/parent ids, group and chord, chain,
links, headers, stamps, priority, routing, ``expires``, time limits and ``reply_to``; it
does not keep the serializer, the compression or ``argsrepr``/``kwargsrepr`` (a
secret hidden from events and Flower would show after the first deferral). Both gates
publish through ``republish``, which adds them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from kombu.serialization import registry

from ._gate_publishes import gate_publishing
from ._park import ParkStore, capture
from ._task_options import HEADER

__all__ = ["message_options", "park", "republish"]

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
    headers = {
        k: v for k, v in (context.headers or {}).items() if k not in _NOT_CARRIED and k != HEADER
    }
    headers[HEADER] = dict(state)
    # Published with ignore_result=True, the header saying what the task was sent with:
    # the worker reads the header, and this publish subscribes to no result (Celery's
    # result consumer would listen for every deferred task in the publishing thread).
    headers["ignore_result"] = _ignore_result(task, context)
    options = message_options(context, content_type, content_encoding)
    return task.signature_from_request(
        context, args, kwargs, countdown=countdown, headers=headers, **options
    )


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
    with gate_publishing():  # the header goes with it, also when sent inside a run
        signature.apply_async(ignore_result=True, add_to_parent=False)


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
) -> bool:
    """Park the run in the funnels' Redis for ``wait`` seconds: the message exactly as
    ``republish`` would publish it (no countdown: it is released when due). False when
    this copy is stale (its task was released and accepted already): drop it.

    Raises:
        BackendError: when Redis fails (the caller keeps the original message).
    """
    signature = _signature(task, context, args, kwargs, None, state, content_type, content_encoding)
    meta = {
        "task": task.name, "funnel": label,
        "priority": (getattr(context, "delivery_info", None) or {}).get("priority"),
        "parked_at": time.time(),
    }  # fmt: skip
    with gate_publishing():
        message = capture(signature, meta, ignore_result=True, add_to_parent=False)
    return store.park(str(context.id), wait, message, str(state.get("release") or ""))
