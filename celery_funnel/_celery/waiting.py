"""``celery inspect funnel_waiting``: the tasks waiting in a worker for a funnel, with
how they wait. ``held``: the worker gate holds it on the consumer's timer (it shows in
``inspect scheduled`` too); ``republished``: the gate published it again with a
countdown, and Celery holds it until then like any ETA task. Each row names the
funnel(s) it waits on (a republished one's are read from the request again). Parked
tasks wait in the funnels' Redis, in no worker: ``celery funnel parked`` lists them."""

from __future__ import annotations

from typing import Any

from .._gate.gate import WorkerGate
from .._shared.charges import label_of, labels_of
from .._shared.state import State, carries_state

__all__ = ["register", "waiting"]

COMMAND = "funnel_waiting"


def waiting(consumer: Any) -> list[dict[str, Any]]:
    """The tasks waiting in ``consumer``'s worker, the next due first."""
    found: list[dict[str, Any]] = []
    gate = consumer.on_task_request
    held = gate.held.listed() if isinstance(gate, WorkerGate) else []
    for request, charges, state in held:
        found.append(_row(request, "held", label_of(charges), state))
    ids = {row["id"] for row in found}
    for waiting_entry in list(consumer.timer.schedule.queue):
        args = getattr(waiting_entry.entry, "args", None) or ()
        scheduled: Any = args[0] if args else None
        headers = getattr(scheduled, "request_dict", None)
        if not isinstance(headers, dict) or not carries_state(headers) or scheduled.id in ids:
            continue
        label = _label(gate, scheduled) if isinstance(gate, WorkerGate) else ""
        found.append(_row(scheduled, "republished", label, State.from_headers(headers)))
    return sorted(found, key=lambda row: row["eta"] or "")


def _label(gate: WorkerGate, request: Any) -> str:
    """The funnels ``request`` waits on, joined as its deferrals report them (its
    charges', then its seats'); "" when its key cannot be read (its run fails in the
    gate, not here)."""
    try:
        args = (request.type, request.name, request.args, request.kwargs)
        charges, seats = gate.charges.of(*args), gate.concurrency.of(*args)
    except Exception:  # a funnel_key that fails
        return ""
    return "+".join(dict.fromkeys([*labels_of(charges), *(s.label for s in seats)]))


def _row(request: Any, how: str, funnel: str, state: State) -> dict[str, Any]:
    eta = request.eta
    return {
        "id": request.id, "name": request.name, "how": how, "funnel": funnel,
        "eta": eta.isoformat() if eta else None, "deferrals": state.deferrals,
        "requeues": state.requeues, "booked": state.booked,
    }  # fmt: skip


def register() -> None:
    """Add the ``funnel_waiting`` inspect command (once per process)."""
    from celery.worker.control import Panel, inspect_command  # noqa: PLC0415 - the worker's

    if COMMAND in Panel.data:
        return

    def funnel_waiting(state: Any, **_: Any) -> list[dict[str, Any]]:
        """Tasks waiting in this worker for a funnel: held or republished."""
        return waiting(state.consumer)

    inspect_command(name=COMMAND)(funnel_waiting)
