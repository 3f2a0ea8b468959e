"""What the ``celery_funnel`` header carries from one delivery of a task to the next,
and the mark the worker gate leaves on the runs it admitted."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["HEADER", "SEND", "State", "admitted_by_gate", "gate_mark", "requeued", "send_mark"]

# the message header the gate writes and reads: this module owns it (what it carries,
# ``State``; the gate's mark); only the gate's own publishes carry it (``_celery.outgoing``)
HEADER = "celery_funnel"
# the message header that marks one send of a task (``_celery.outgoing``): every copy the
# gate makes of it keeps the mark, another send of the same task id has another
SEND = "celery_funnel_send"
_HOST = socket.gethostname()  # read once: the gate marks every run it admits


class State(NamedTuple):
    """What the ``celery_funnel`` header carries from one delivery of a task to the next."""

    deferrals: int = 0  # times deferred so far
    booked: bool = False  # a slot is booked under the task id
    stale: int = 0  # times its ticket came too late (the late grace doubles each time)
    outages: int = 0  # deferrals in a row because the funnel's Redis failed
    passed: tuple[int, ...] = ()  # funnels already passed (decided one at a time)
    waited: float = 0.0  # the countdown this message was published with (seconds)
    requeues: int = 0  # times published again (holds in a worker are not counted)
    release: str = ""  # the token of the parked release this copy came from, if any

    @classmethod
    def from_headers(cls, headers: Mapping[str, Any] | None) -> State:
        """The state in a message's headers (a fresh one when absent)."""
        raw = (headers or {}).get(HEADER)
        if not raw:  # a first arrival: most tasks
            return FRESH
        return cls(
            int(raw.get("deferrals", 0)),
            bool(raw.get("booked")),
            int(raw.get("stale", 0)),
            int(raw.get("outages", 0)),
            tuple(int(i) for i in raw.get("passed") or ()),
            float(raw.get("waited", 0.0)),
            int(raw.get("requeues", 0)),
            str(raw.get("release") or ""),
        )

    def header(self, **more: Any) -> dict[str, Any]:
        """The header value (JSON-safe), with ``more`` fields. A first arrival's state
        (``FRESH``, most runs) writes only ``more``: a field left out reads as its
        default (``from_headers``), and the header travels to the pool with every run."""
        if self is FRESH:
            return more
        return {**self._asdict(), "passed": list(self.passed), **more}


FRESH = State()  # a first arrival's state (immutable: one for all)


def gate_mark(pid: int | None = None) -> str:
    """What the worker gate writes into the header of a run it admitted: its host and
    process. Only that process (threads, solo) or its pool children (prefork) see the
    mark as theirs, so a copy carried by a retried message elsewhere means nothing."""
    return _own_mark() if pid is None else _mark(pid)


@functools.lru_cache(maxsize=64)
def _mark(pid: int) -> str:
    return f"{_HOST}:{pid}"


@functools.cache
def _own_mark() -> str:  # read once per process: the gate marks every run it admits
    return _mark(os.getpid())


if hasattr(os, "register_at_fork"):  # a forked pool process is a process of its own
    os.register_at_fork(after_in_child=_own_mark.cache_clear)


def admitted_by_gate(headers: Mapping[str, Any] | None) -> bool:
    """Whether this process's worker gate admitted the run with these headers."""
    mark = ((headers or {}).get(HEADER) or {}).get("gate")
    return mark is not None and mark in (gate_mark(), gate_mark(os.getppid()))


def requeued(state: State, countdown: float) -> dict[str, Any]:
    """The header of a run published again with ``countdown``."""
    return state._replace(waited=countdown, requeues=state.requeues + 1).header()


def send_mark(context: Any) -> str:
    """The mark of the send ``context`` (a Celery ``Context``) came from ("" for a send
    without one: a producer without celery-funnel)."""
    found = getattr(context, SEND, None) or (getattr(context, "headers", None) or {}).get(SEND)
    return str(found or "")
