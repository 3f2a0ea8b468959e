"""The worker gate's side of concurrency limits: which slots a run needs (``SlotFunnels.of``),
taking them before the run reaches the pool, and queueing a refused run as a parked
waiter (``_leases``), published again when a slot is handed to it.

A run needs a slot in its FunnelTask's ``funnel_concurrency`` funnel (one per
``funnel_key`` value) and in every matching ``funnel_limits`` entry with
``"concurrency"`` (one per worker with ``"scope": "worker"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._config.options import concurrency_of, option_of
from .._config.runtime import Runtime
from .._limiter.concurrency import Concurrency
from .._limiter.limit import key_part
from .._stores.leases import Lease, SlotFunnel, slot_funnels_of
from .charges import matching
from .leases import Leases, connect, leases_for
from .live import live_for
from .overrides import concurrency_for
from .state import HEADER

__all__ = ["WAIT_SECONDS", "SlotFunnels"]

# A waiter is released when a slot is handed to it; failing that (a Redis failure
# between parking it and queueing it, its queue deleted by ``reset``), after an hour,
# to be checked again, keeping its place in the queue.
WAIT_SECONDS = 3600.0


class SlotFunnels:
    """The slots of task requests for one app in one worker (``node``: its name;
    ``hostname``: the safe key part of it, for ``"scope": "worker"``)."""

    def __init__(self, runtime: Runtime, app: Any, node: str, hostname: str) -> None:
        self.runtime, self.app, self.node, self.hostname = runtime, app, node, hostname
        self._by_name: dict[str, tuple[Concurrency, ...]] = {}
        self._leases: Leases | None = None
        self.on = bool(runtime.settings.concurrency) or any(
            option_of(task, "funnel_concurrency") is not None for task in list(app.tasks.values())
        )
        if self.on:
            # the receivers that give slots back: only where slots are taken, so that
            # other apps' tasks do not pay a task_postrun signal each
            connect()

    @property
    def leases(self) -> Leases:
        """This worker's leases (made on first use: the funnels' Redis is needed)."""
        if self._leases is None:
            self._leases = leases_for(self.app, self.node)
        return self._leases

    def _worker_wide(self, name: str) -> tuple[Concurrency, ...]:
        if name not in self._by_name:
            self._by_name[name] = matching(self.runtime.settings.concurrency, name)
        return self._by_name[name]

    def of(
        self, type_: str, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> list[SlotFunnel]:
        """The slots one run of task ``type_`` (sent as ``name``) needs.

        Raises:
            Exception: what a ``funnel_key`` callable raises; ``ConfigurationError``
                for a bad value.
        """
        if not self.on:
            return []
        slot_funnels: list[SlotFunnel] = []
        task = self.app.tasks.get(type_)
        n = concurrency_of(task) if task is not None else None
        table = live_for(self.app).overrides  # `celery funnel set NAME --concurrency N`
        if n is not None:
            part = key_part(option_of(task, "funnel_key"), task.run, args, kwargs)
            n = concurrency_for(table, type_, n) or n
            slot_funnels.append(SlotFunnel(n, self.runtime.task_key(type_, part), type_))
        for limit in self._worker_wide(name):
            worker = self.hostname if limit.scope == "worker" else ""
            key = self.runtime.limit_key(limit.pattern, worker)
            label = f"limit:{limit.pattern}"
            slot_funnels.append(
                SlotFunnel(concurrency_for(table, label, limit.n) or limit.n, key, label)
            )
        return slot_funnels

    def take(self, request: Any, slot_funnels: Sequence[SlotFunnel]) -> Lease | None:
        """Take every slot of ``slot_funnels`` for ``request``: the lease, or None when it
        must wait (nothing taken).

        Raises:
            BackendError: when Redis fails.
        """
        leases = self.leases
        promised = (request.request_dict.get(HEADER) or {}).get("promised")
        elsewhere = [s for s in slot_funnels_of(promised) if s not in slot_funnels]
        if elsewhere:  # handed a slot another worker counts: give it up there
            leases.hand_on(leases.store.release(elsewhere, request.id, "")[1])
        lease, promoted = leases.store.acquire(slot_funnels, request.id, self.node)
        leases.know(slot_funnels)
        leases.hand_on(promoted)
        return lease

    def queue(self, request: Any, slot_funnels: Sequence[SlotFunnel], rank: int = 0) -> None:
        """``request`` was parked: queue it for a slot (it may get one at once), behind
        the waiters of its priority ``rank`` (the broker's order, 0 first).

        Raises:
            BackendError: when Redis fails.
        """
        leases = self.leases
        leases.hand_on(leases.store.enqueue(slot_funnels, request.id, rank))

    def started(self, lease: Lease, request: Any) -> None:
        """The run of ``request`` holding ``lease`` goes to the pool: renew it until
        it ends."""
        self.leases.track(lease, request)

    def give_back(self, lease: Lease) -> None:
        """The run will not start (another funnel refused it, or it failed in the
        gate): give its slots back at once."""
        self.leases.end(lease.task_id, lease)

    def close(self) -> None:
        """The worker shuts down: stop renewing, give back what is still held."""
        if self._leases is not None:
            self._leases.stop()

    def forget(self, request: Any) -> None:
        """``request`` ends without running (revoked, expired): give up a slot handed
        to it while parked, and its place in the queue. Never raises."""
        try:
            slot_funnels = self.of(request.type, request.name, request.args, request.kwargs)
            if slot_funnels:
                leases = self.leases
                leases.hand_on(leases.store.release(slot_funnels, request.id, "")[1])
        except Exception:  # the handed slot runs out after the TTL
            return
