"""A toy concurrency variant, kept outside the package as docs/architecture.md's
"Recipe: add a concurrency variant" says (one module; it needs no script of its own):
``toy_queue_cap``, a cap on queued tasks. At most N of a ``funnel_limits`` entry's runs
run at once, as the built-in variant's seats; at most ``CAP`` wait for a seat, and a
run refused one while ``CAP`` wait already fails at once (``QueueFullError``) instead
of queueing. A toy: the count and the queueing are two calls, so two workers refusing
runs at the same instant may queue one more (a variant of the package would count and
queue in one script, its own ``lua/concurrency_<variant>.lua``)."""

from __future__ import annotations

from typing import Any

from celery_funnel import FunnelError
from celery_funnel._gate.arrival import Arrival
from celery_funnel._gate.concurrency import Concurrency, Variant, register

NAME = "toy_queue_cap"
CAP = 2  # runs that may wait for a seat of one funnel


class QueueFullError(FunnelError):
    """A run refused a seat while ``CAP`` runs wait for one already."""


class ToyQueueCap(Variant):
    """The built-in seats, but a run refused one waits only while fewer than ``CAP``
    wait: the one step it does otherwise is ``wait``."""

    name = NAME

    def wait(self, concurrency: Concurrency, arrival: Arrival) -> Any:
        store = concurrency.renewal.store
        mine = [seat for seat in arrival.seats if seat.variant == NAME]
        queued = max(store.waiting(seat.key) for seat in mine)
        if queued < CAP:
            return super().wait(concurrency, arrival)
        request = arrival.request
        error = QueueFullError(
            f"task {request.name}[{request.id}]: {queued} runs wait for a seat of"
            f" {concurrency.label(arrival)} already ({NAME}: at most {CAP})"
        )
        return concurrency.fail(request, error, False)


def register_variant() -> None:
    """Make ``toy_queue_cap`` a variant an entry may name (the worker: at import of its
    project; the test: in a fixture)."""
    register(ToyQueueCap())
