"""The worker's services beside the gate, composed here, in one place, in the order
Celery's bootsteps give them (each later one ``requires`` the earlier):

1. ``FunnelGate`` (``_celery.worker``, a consumer bootstep) composes the gate
   (``gate``): the ``WorkerGate`` (``_gate.gate``: the decision on one message), handed
   what it calls outside ``_gate``: whether a task's own options apply and its own
   charges (``_celery.task``), the unique tasks' front (``_celery.unique.Front``), and
   this worker's lease renewal (``_celery.concurrency_renewal``, a thread started at
   the first seat taken); with it, where seats are taken, the signal receivers that
   free them when a run ends (``_celery.concurrency_signals``), and the hand-off
   listener that wakes held waiters handed a seat (``_celery.concurrency_handoff``, a
   thread started at the first one).
2. ``ReleaserStep`` (``_celery.releaser``; requires ``FunnelGate``) runs the releaser
   (``releaser``): handed the fair-share dispatcher (``_celery.dispatch``) where a task
   has a fair funnel, and the release publisher (``_celery.release``).
3. ``LiveStep`` (``_ops.live``; requires ``FunnelGate``) runs the live thread.

Stopped in the reverse order: the gate's shutdown stops the renewal and closes the
funnels' Redis client the later services use."""

from __future__ import annotations

from typing import Any

from .._config.options import option_of
from .._config.runtime import Runtime, runtime_for
from .._gate.gate import WorkerGate
from .._stores.fair import FairStore
from . import concurrency_signals
from .concurrency_handoff import HandOffListener
from .concurrency_renewal import renewal_for
from .dispatch import Dispatcher
from .releaser import Releaser, has_fair_funnel, park_store
from .task import FunnelTask, own_charges
from .unique import Front

__all__ = ["gate", "releaser"]


def _is_funnel_task(task: Any) -> bool:
    return isinstance(task, FunnelTask)


def _uses(app: Any, option: str) -> bool:
    """Whether a FunnelTask of ``app`` sets ``option``."""
    return any(
        isinstance(t, FunnelTask) and option_of(t, option) is not None
        for t in list(app.tasks.values())
    )


def gate(runtime: Runtime, consumer: Any) -> WorkerGate:
    """The worker gate of ``consumer``, with the services it is handed (see above)."""
    gate = WorkerGate(
        runtime, consumer, consumer.on_task_request, _is_funnel_task,
        own_charges=own_charges, renewal=renewal_for,
    )  # fmt: skip
    if gate.concurrency.on:
        # the receivers that free seats: only where seats are taken, so that other
        # apps' tasks do not pay a task_postrun signal each
        concurrency_signals.connect()
        # held waiters (nothing parked) are woken when handed a seat
        gate.concurrency.hand_offs = HandOffListener(
            lambda: runtime.funnel.client, runtime.settings.key_prefix, gate.node,
            gate.held.wake_tasks,
        )  # fmt: skip
    if _uses(consumer.app, "funnel_unique"):  # others pay nothing for it
        gate.handle = Front(runtime, consumer.app, gate.handle, gate.events)
    return gate


def releaser(consumer: Any, revoked: Any) -> Releaser | None:
    """The releaser of ``consumer``'s app (None: parking is off), with the fair-share
    dispatcher where a task of the app has a fair funnel (others release as before)."""
    app = consumer.app
    store = park_store(app)
    if store is None:
        return None
    runtime = runtime_for(app)
    fair = has_fair_funnel(app)
    dispatcher = Dispatcher(FairStore(store.client, runtime.settings.key_prefix)) if fair else None
    return Releaser(app, store, runtime.settings.park_lease, revoked=revoked, dispatcher=dispatcher)
