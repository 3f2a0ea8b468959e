"""The gate's own publishes: a message published inside ``gate_publishing()`` keeps the
``celery_funnel`` header the gate wrote, also when it is sent from inside a task's run
(``FunnelTask`` defers from ``before_start``). Every other message a run sends loses it
(``_outgoing``)."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gate_publishes", "gate_publishing"]

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
