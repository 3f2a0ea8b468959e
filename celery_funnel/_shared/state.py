"""What the ``celery_funnel`` header carries from one delivery of a task to the next,
and the mark the worker gate leaves on the runs it admitted. This module is the
header's one owner: it reads every field (``State``) and builds every value written;
other modules ask it (``carries_state``, ``put_state``, ``drop_state``)."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, NamedTuple

from .._stores.concurrency import ConcurrencyFunnel, Lease

__all__ = [
    "HEADER", "SEND", "State", "admitted_by_gate", "carries_state", "drop_state", "gate_mark",
    "put_state", "release_only", "requeued", "send_mark",
]  # fmt: skip

# the message header the gate writes and reads: this module owns it (what it carries,
# ``State``; the gate's mark); only the gate's own publishes carry it (``_celery.outgoing``)
HEADER = "celery_funnel"
# the message header that marks one send of a task (``_celery.outgoing``): every copy the
# gate makes of it keeps the mark, another send of the same task id has another
SEND = "celery_funnel_send"
_HOST = socket.gethostname()  # read once: the gate marks every run it admits


class State(NamedTuple):
    """What the ``celery_funnel`` header carries from one delivery of a task to the
    next (the fields up to ``release``, written again by every publish: ``header``),
    and what one delivery carries for itself alone (``lease``, ``promised``: written
    only where they are made, never carried on)."""

    deferrals: int = 0  # times deferred so far
    booked: bool = False  # a slot is booked under the task id
    stale: int = 0  # times its ticket came too late (the late grace doubles each time)
    outages: int = 0  # deferrals in a row because the funnel's Redis failed
    passed: tuple[int, ...] = ()  # funnels already passed (decided one at a time)
    waited: float = 0.0  # the countdown this message was published with (seconds)
    requeues: int = 0  # times published again (holds in a worker are not counted)
    release: str = ""  # the token of the parked release this copy came from, if any
    # the seats its run holds, for the process that runs it to free them (``admitted``)
    lease: Lease | None = None
    # seats handed to it while it waited parked (``released``): a worker that does not
    # count one of them gives it up
    promised: tuple[ConcurrencyFunnel, ...] = ()

    @classmethod
    def from_headers(cls, headers: Mapping[str, Any] | None) -> State:
        """The state in a message's headers (a fresh one when absent); its lease is
        read under the headers' task ``id``."""
        raw = (headers or {}).get(HEADER)
        if not raw:  # a first arrival: most tasks
            return FRESH
        return cls._read(raw, str((headers or {}).get("id") or ""))

    @classmethod
    def of_run(cls, context: Any) -> State:
        """The state of a running task's request (a Celery ``Context``): the header is
        one of its attributes, or in its ``headers``."""
        raw = getattr(context, HEADER, None) or (getattr(context, "headers", None) or {}).get(
            HEADER
        )
        return cls._read(raw, str(getattr(context, "id", "") or "")) if raw else FRESH

    @classmethod
    def _read(cls, raw: Mapping[str, Any], task_id: str) -> State:
        return cls(
            int(raw.get("deferrals", 0)),
            bool(raw.get("booked")),
            int(raw.get("stale", 0)),
            int(raw.get("outages", 0)),
            tuple(int(i) for i in raw.get("passed") or ()),
            float(raw.get("waited", 0.0)),
            int(raw.get("requeues", 0)),
            str(raw.get("release") or ""),
            _lease(task_id, raw.get("lease")),
            _funnels(raw.get("promised")),
        )

    def header(self) -> dict[str, Any]:
        """The header value (JSON-safe) of what is carried from one delivery to the
        next. A first arrival's state (``FRESH``, most runs) writes nothing: a field
        left out reads as its default (``from_headers``), and the header travels to the
        pool with every run."""
        if self is FRESH:
            return {}
        return {
            "deferrals": self.deferrals, "booked": self.booked, "stale": self.stale,
            "outages": self.outages, "passed": list(self.passed), "waited": self.waited,
            "requeues": self.requeues, "release": self.release,
        }  # fmt: skip

    def admitted(self, lease: Lease | None, mark: str | None = None) -> dict[str, Any]:
        """The header of a run the worker gate admitted: what it carries, the gate's
        ``mark`` (``gate_mark()`` when None) and the ``lease`` of its seats, if it
        holds any."""
        header = self.header()
        header["gate"] = gate_mark() if mark is None else mark
        if lease is not None:
            # "seats": the header's name before 0.4, kept: messages in flight carry it
            header["lease"] = {"token": lease.token, "seats": _written(lease.funnels)}
        return header

    def admit(self, headers: MutableMapping[str, Any], lease: Lease | None) -> None:
        """Mark a run the worker gate admitted: its header (``admitted``, this process's
        mark) into its request's ``headers``."""
        if self is FRESH and lease is None:  # most runs: the mark alone
            headers[HEADER] = {"gate": _own_mark()}
        else:
            headers[HEADER] = self.admitted(lease)

    def released(self, token: str, promised: Sequence[ConcurrencyFunnel] = ()) -> dict[str, Any]:
        """The header of a parked copy released to run: what it carries, the ``token``
        of its release, and the seats ``promised`` to it (handed while it waited)."""
        header = self.header()
        header["release"] = token
        if promised:
            header["promised"] = _written(promised)
        return header


def _funnels(raw: Any) -> tuple[ConcurrencyFunnel, ...]:
    """Concurrency funnels as the header carries them (``[[n, key, label], ...]``;
    anything else, none: every reader of the header reads this field)."""
    if not isinstance(raw, list):
        return ()
    return tuple(ConcurrencyFunnel(int(n), str(key), str(label)) for n, key, label in raw)


def _written(funnels: Sequence[ConcurrencyFunnel]) -> list[list[Any]]:
    """``funnels`` as the header carries them."""
    return [[funnel.n, funnel.key, funnel.label] for funnel in funnels]


def _lease(task_id: str, raw: Any) -> Lease | None:
    """The lease a header's ``lease`` field carries (None when it carries none)."""
    if not isinstance(raw, dict) or not raw.get("token"):
        return None
    return Lease(task_id, str(raw["token"]), _funnels(raw.get("seats")))


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


def release_only(token: str) -> dict[str, Any]:
    """The header of a message a run sends of its own task id: only the token of the
    copy it came from (``_celery.outgoing``)."""
    return {"release": token}


def carries_state(headers: Mapping[str, Any]) -> bool:
    """Whether a message's ``headers`` carry the gate's header."""
    return HEADER in headers


def drop_state(headers: MutableMapping[str, Any]) -> None:
    """Take the gate's header out of a message's ``headers``."""
    headers.pop(HEADER, None)


def put_state(headers: MutableMapping[str, Any], header: dict[str, Any]) -> None:
    """Put ``header`` (built here: ``State.header``, ``admitted``, ``released``,
    ``requeued``, ``release_only``) into a message's ``headers`` as the gate's header."""
    headers[HEADER] = header


def send_mark(context: Any) -> str:
    """The mark of the send ``context`` (a Celery ``Context``) came from ("" for a send
    without one: a producer without celery-funnel)."""
    found = getattr(context, SEND, None) or (getattr(context, "headers", None) or {}).get(SEND)
    return str(found or "")
