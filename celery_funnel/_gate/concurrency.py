"""The worker gate's side of concurrency limits: which seats a run needs (``SlotFunnels.of``),
taking them before the run reaches the pool (``Seats.take``), and making a refused run
wait, queued in arrival order: parked as a waiter (published again by the run that frees
a seat) where tasks may be parked, else a held waiter (held in the worker, its message
un-acked; the script that frees a seat hands it one and tells this worker on its
channel, ``HandOffs``, which wakes it at once); or, when the funnels' Redis fails, the
outage policy.

A run needs a seat in its FunnelTask's ``funnel_concurrency`` funnel (one per
``funnel_key`` value) and in every matching ``funnel_limits`` entry with
``"concurrency"`` (one per worker with ``"scope": "worker"``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

from .._config.options import concurrency_of, option_of
from .._config.runtime import Runtime
from .._config.waiting import HELD_MARK_SECONDS, Way
from .._limiter.concurrency import Concurrency
from .._limiter.errors import BackendError
from .._limiter.limit import key_part
from .._stores.leases import Handed, HeldWaiter, Lease, LeaseStore, SlotFunnel, slot_funnels_of
from .arrival import Arrival
from .charges import matching
from .judge import Ruling, on_outage
from .live import live_for
from .overrides import concurrency_for
from .parking import Parking
from .state import HEADER
from .waits import Waits

__all__ = ["HandOffs", "Renewal", "RenewalOf", "Seats", "SlotFunnels"]


class Renewal(Protocol):
    """This worker's leases, renewed while their runs run: the renewal service
    (``_celery.renewal.Leases``), handed to the gate by ``_celery.services``."""

    store: LeaseStore

    def hand_on(self, handed: list[Handed]) -> None: ...
    def owe(self, lease: Lease) -> None: ...
    def know(self, slot_funnels: Iterable[SlotFunnel]) -> None: ...
    def track(self, lease: Lease, request: Any) -> None: ...
    def end(self, task_id: str, lease: Lease | None = None, *, force: bool = False) -> None: ...
    def stop(self) -> None: ...


RenewalOf = Callable[[Any, str], Renewal]
"""The renewal service of an app in this process, for a worker's node name."""


class HandOffs(Protocol):
    """This worker's hand-off listener (``_celery.handoff``): told on ``channel`` that
    a held waiter was handed a seat, it wakes it; started at the first held waiter."""

    channel: str

    def start(self) -> None: ...
    def stop(self) -> None: ...


class SlotFunnels:
    """The seats of task requests for one app in one worker (``node``: its name;
    ``hostname``: the safe key part of it, for ``"scope": "worker"``)."""

    def __init__(
        self, runtime: Runtime, app: Any, node: str, hostname: str, renewal: RenewalOf
    ) -> None:
        self.runtime, self.app, self.node, self.hostname = runtime, app, node, hostname
        self.renewal = renewal
        self._by_name: dict[str, tuple[Concurrency, ...]] = {}
        self._leases: Renewal | None = None
        self.hand_offs: HandOffs | None = None  # composed by ``_celery.services``
        self.on = bool(runtime.settings.concurrency) or any(
            option_of(task, "funnel_concurrency") is not None for task in list(app.tasks.values())
        )

    @property
    def leases(self) -> Renewal:
        """This worker's leases (made on first use: the funnels' Redis is needed)."""
        if self._leases is None:
            self._leases = self.renewal(self.app, self.node)
        return self._leases

    def _worker_wide(self, name: str) -> tuple[Concurrency, ...]:
        if name not in self._by_name:
            self._by_name[name] = matching(self.runtime.settings.concurrency, name)
        return self._by_name[name]

    def of(
        self, type_: str, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> list[SlotFunnel]:
        """The seats one run of task ``type_`` (sent as ``name``) needs.

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

    def take(
        self, request: Any, slot_funnels: Sequence[SlotFunnel], *, held: bool = False,
        rank: int = 0,
    ) -> Lease | None:  # fmt: skip
        """Take every seat of ``slot_funnels`` for ``request``: the lease, or None when it
        must wait (nothing taken; ``held``: it waits in this worker, queued as a held
        waiter of priority ``rank``, where a hand-off listener can wake it).

        Raises:
            BackendError: when Redis fails.
        """
        self.runtime.outage.check()  # no call waits on a Redis known to fail
        leases = self.leases
        promised = (request.request_dict.get(HEADER) or {}).get("promised")
        elsewhere = [s for s in slot_funnels_of(promised) if s not in slot_funnels]
        if elsewhere:  # handed a seat another worker counts: give it up there
            leases.hand_on(leases.store.release(elsewhere, request.id, "")[1])
        token = uuid.uuid4().hex
        try:
            lease, promoted = leases.store.acquire(
                slot_funnels, request.id, self.node, token, self._held_waiter(held, rank)
            )
        except BackendError:  # it may still take them (the call ran, its reply was lost)
            leases.owe(Lease(request.id, token, tuple(slot_funnels)))
            raise
        leases.know(slot_funnels)
        leases.hand_on(promoted)
        return lease

    def _held_waiter(self, held: bool, rank: int) -> HeldWaiter | None:
        """How a run held here is queued, if it is (a listener to wake it is needed)."""
        if not held or self.hand_offs is None:
            return None
        self.hand_offs.start()
        return HeldWaiter(self.hand_offs.channel, HELD_MARK_SECONDS, rank)

    def queue(self, request: Any, slot_funnels: Sequence[SlotFunnel], rank: int = 0) -> None:
        """``request`` was parked: queue it for a seat (it may get one at once), behind
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

    def free(self, lease: Lease) -> None:
        """The run will not start (another funnel refused it, or it failed in the
        gate): free its seats at once."""
        self.leases.end(lease.task_id, lease)

    def close(self) -> None:
        """The worker shuts down: stop renewing, give back what is still held."""
        if self.hand_offs is not None:
            self.hand_offs.stop()
        if self._leases is not None:
            self._leases.stop()

    def forget(self, request: Any) -> None:
        """``request`` ends without running (revoked, expired): give up a seat handed
        to it while parked, and its place in the queue. Never raises."""
        try:
            slot_funnels = self.of(request.type, request.name, request.args, request.kwargs)
            if slot_funnels:
                leases = self.leases
                leases.hand_on(leases.store.release(slot_funnels, request.id, "")[1])
        except Exception:  # the handed seat runs out after the TTL
            return


Admit = Callable[[Arrival, "Lease | None"], Any]  # run it (what the gate returns)
Fail = Callable[[Any, BaseException, bool], Any]  # fail the request (reported or not)


class Seats:
    """The seats of the worker gate's runs: ``admit`` runs a request, ``fail`` fails it."""

    def __init__(
        self, runtime: Runtime, slot_funnels: SlotFunnels, parking: Parking, waits: Waits,
        admit: Admit, fail: Fail,
    ) -> None:  # fmt: skip
        self.runtime, self.slot_funnels, self.parking, self.waits = (
            runtime,
            slot_funnels,
            parking,
            waits,
        )
        self.admit, self.fail = admit, fail

    def take(self, arrival: Arrival) -> tuple[Lease | None, Any]:
        """The lease of every seat ``arrival`` needs, or (None, what the gate returns)
        when it waits: parked, held, run or failed by the outage policy.

        Raises:
            Exception: what computing a key raised (the gate fails the task).
        """
        try:
            held, rank = not self.parking.on, arrival.subject.rank or 0
            lease = self.slot_funnels.take(
                arrival.request, arrival.slot_funnels, held=held, rank=rank
            )
        except BackendError as error:
            return None, self._outage(arrival, error)
        if lease is None:
            self._wait(arrival)
        return lease, None

    def _label(self, arrival: Arrival) -> str:
        return "+".join(slot_funnel.label for slot_funnel in arrival.slot_funnels)

    def _outage(self, arrival: Arrival, error: BackendError) -> Any:
        """The funnels' Redis failed taking a seat: the outage policy decides (run
        now, unlimited; fail; or hold for a back-off and try again)."""
        label = self._label(arrival)
        step = on_outage(self.runtime, arrival.subject, arrival.state, error, label)
        if step.run:
            return self.admit(arrival, None)
        if step.error is not None:
            return self.fail(arrival.request, step.error, True)
        return self.waits.wait(arrival, step)

    def _wait(self, arrival: Arrival) -> None:
        """No seat: wait as the wait policy says (``_config.waiting``): a waiter, parked
        and queued (``Parking.park``: due soon until queued, then after
        ``WAITER_SECONDS``), whom the run that frees a seat hands it and publishes (the
        renewal service); or, where nothing may be parked
        (``_stores.persistence``), a held waiter (queued by ``take``): held in the
        worker (or the broker, past what it may hold), woken when handed a seat, and
        looking again every ``LOOK_SECONDS``."""
        state, request = arrival.state, arrival.request
        live_for(self.runtime.app).count([s.label for s in arrival.slot_funnels], False)
        after = state._replace(deferrals=state.deferrals + 1)
        way, delay = self.runtime.waiting.for_seat(parking=self.parking.on)
        if way is not Way.WAITER:
            self.waits.wait(arrival, Ruling(run=False, delay=delay, state=after))
            return
        label = self._label(arrival)
        step = Ruling(run=False, delay=delay, state=after)
        self.waits.report(arrival, step._replace(delay=0.0), label, how="parked")
        rank = arrival.subject.rank or 0
        queue = partial(self.slot_funnels.queue, request, arrival.slot_funnels, rank)
        self.waits.park(arrival, step, label, queue)
