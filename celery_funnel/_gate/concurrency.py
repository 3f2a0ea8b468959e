"""The worker gate's side of concurrency limits, behind one entry (``Concurrency``):
which seats a run needs (``of``), taking them before the run reaches the pool
(``take``), the run going to the pool (``started``: its leases renewed until it ends),
freeing them when it will not start (``free``), and making a refused run wait
(``wait``): queued in arrival order, parked as a waiter (published again by the run
that frees a seat) where tasks may be parked, else a held waiter (held in the worker,
its message un-acked; the script that frees a seat hands it one and tells this worker
on its channel, ``HandOffs``, which wakes it at once); or, when the funnels' Redis
fails, the outage policy.

A run needs a seat in its FunnelTask's ``funnel_concurrency`` funnel (one per
``funnel_key`` value) and in every matching ``funnel_limits`` entry with
``"concurrency"`` (one per worker with ``"scope": "worker"``).

How those four go is a concurrency funnel's variant (``Variant``): the built-in
one, ``"seats"``, is this module's; an entry's ``"variant"`` names another, registered
with ``register`` (docs/architecture.md, "Recipe: add a concurrency variant").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from .._config.options import concurrency_of, option_of
from .._config.runtime import Runtime
from .._config.waiting import HELD_MARK_SECONDS, Way
from .._limiter.concurrency import SEATS, ConcurrencyLimit
from .._limiter.errors import BackendError, ConfigurationError
from .._limiter.limit import key_part
from .._shared.charges import matching
from .._shared.judge import Ruling, on_outage
from .._shared.live import live_for
from .._shared.overrides import concurrency_for
from .._stores.concurrency import ConcurrencyFunnel, HeldWaiter, Lease
from .arrival import Arrival
from .concurrency_services import HandOffs, Renewal, RenewalOf
from .parking import Parking
from .waits import Waits

__all__ = ["Concurrency", "Variant", "register", "variant_named"]


Admit = Callable[[Arrival, "Lease | None"], Any]  # run it (what the gate returns)
Fail = Callable[[Any, BaseException, bool], Any]  # fail the request (reported or not)


class Variant:
    """How the seats of a concurrency funnel are taken, started, freed and waited for:
    the built-in variant, ``"seats"`` (at most N runs at once, leased in the funnels'
    Redis: ``_stores.concurrency``). Another variant subclasses it, overrides what it
    does otherwise, and is ``register``ed under its ``name``; each method is handed the
    gate's ``Concurrency`` (its store, renewal, waits and callbacks)."""

    name = SEATS

    def take(self, concurrency: Concurrency, arrival: Arrival) -> tuple[Lease | None, Any]:
        """The lease of every seat ``arrival`` needs, or (None, what the gate returns)
        when it waits (``wait``): parked, held, run or failed by the outage policy."""
        try:
            held, rank = not concurrency.parking.on, arrival.subject.rank or 0
            lease = concurrency.lease(arrival, held=held, rank=rank)
        except BackendError as error:
            return None, concurrency.outage(arrival, error)
        if lease is None:  # a decision on its funnels: counted as live control's table shows
            live_for(concurrency.runtime.app).count([s.label for s in arrival.seats], False)
            return None, self.wait(concurrency, arrival)
        return lease, None

    def started(self, concurrency: Concurrency, lease: Lease, request: Any) -> None:
        """The run of ``request`` holding ``lease`` goes to the pool: renew it until
        it ends (the renewal service frees it then)."""
        concurrency.renewal.track(lease, request)

    def free(self, concurrency: Concurrency, lease: Lease) -> None:
        """The run will not start (another funnel refused it, or it failed in the
        gate): free its seats at once."""
        concurrency.renewal.end(lease.task_id, lease)

    def wait(self, concurrency: Concurrency, arrival: Arrival) -> Any:
        """No seat: wait as the wait policy says (``_config.waiting``): a waiter, parked
        and queued (``Parking.park``: due soon until queued, then after
        ``WAITER_SECONDS``), whom the run that frees a seat hands it and publishes (the
        renewal service); or, where nothing may be parked (``_stores.persistence``), a
        held waiter (queued by ``take``): held in the worker (or the broker, past what
        it may hold), woken when handed a seat, and looking again every
        ``LOOK_SECONDS``. What the gate returns."""
        state, waits = arrival.state, concurrency.waits
        after = state._replace(deferrals=state.deferrals + 1)
        way, delay = concurrency.runtime.waiting.for_seat(parking=concurrency.parking.on)
        ruling = Ruling(run=False, delay=delay, state=after)
        if way is not Way.WAITER:
            waits.wait(arrival, ruling)
            return None
        label = concurrency.label(arrival)
        waits.report(arrival, ruling._replace(delay=0.0), label, how="parked")
        rank = arrival.subject.rank or 0
        queue = partial(concurrency.queue, arrival.request, arrival.seats, rank)
        waits.park(arrival, ruling, label, queue)
        return None


_VARIANTS: dict[str, Variant] = {SEATS: Variant()}


def register(variant: Variant) -> None:
    """Make ``variant`` the one a ``funnel_limits`` entry's ``"variant"`` names."""
    _VARIANTS[variant.name] = variant


def variant_named(name: str, where: str = "a concurrency limit") -> Variant:
    """The registered variant ``name``.

    Raises:
        ConfigurationError: naming ``where`` and the variants there are.
    """
    found = _VARIANTS.get(name)
    if found is None:
        raise ConfigurationError(
            f"{where}: no concurrency variant {name!r}; the variants are {sorted(_VARIANTS)}"
        )
    return found


class Concurrency:
    """The gate's one entry to concurrency, for one app in one worker (``node``: its
    name; ``hostname``: the safe key part of it, for ``"scope": "worker"``): ``of``,
    then ``take``, ``started``, ``free`` and ``wait``, each by the variant of the
    run's seats. ``admit`` runs a request, ``fail`` fails it (the gate's)."""

    def __init__(
        self, runtime: Runtime, app: Any, node: str, hostname: str, renewal: RenewalOf, *,
        parking: Parking, waits: Waits, admit: Admit, fail: Fail,
    ) -> None:  # fmt: skip
        self.runtime, self.app, self.node, self.hostname = runtime, app, node, hostname
        self.renewal_of, self.parking, self.waits = renewal, parking, waits
        self.admit, self.fail = admit, fail
        self._by_name: dict[str, tuple[ConcurrencyLimit, ...]] = {}
        self._renewal: Renewal | None = None
        self.hand_offs: HandOffs | None = None  # composed by ``_celery.services``
        self.on = bool(runtime.settings.concurrency) or any(
            option_of(task, "funnel_concurrency") is not None for task in list(app.tasks.values())
        )

    @property
    def renewal(self) -> Renewal:
        """This worker's renewal service (made on first use: the funnels' Redis is
        needed)."""
        if self._renewal is None:
            self._renewal = self.renewal_of(self.app, self.node)
        return self._renewal

    def _worker_wide(self, name: str) -> tuple[ConcurrencyLimit, ...]:
        if name not in self._by_name:
            found = matching(self.runtime.settings.concurrency, name)
            for limit in found:  # a variant not registered fails the task, named
                variant_named(limit.variant, f"funnel_limits[{limit.pattern!r}]")
            self._by_name[name] = found
        return self._by_name[name]

    def of(
        self, type_: str, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> list[ConcurrencyFunnel]:
        """The seats one run of task ``type_`` (sent as ``name``) needs.

        Raises:
            Exception: what a ``funnel_key`` callable raises; ``ConfigurationError``
                for a bad value.
        """
        if not self.on:
            return []
        funnels: list[ConcurrencyFunnel] = []
        task = self.app.tasks.get(type_)
        n = concurrency_of(task) if task is not None else None
        table = live_for(self.app).overrides  # `celery funnel set NAME --concurrency N`
        if n is not None:
            part = key_part(option_of(task, "funnel_key"), task.run, args, kwargs)
            n = concurrency_for(table, type_, n) or n
            funnels.append(ConcurrencyFunnel(n, self.runtime.task_key(type_, part), type_))
        for limit in self._worker_wide(name):
            worker = self.hostname if limit.scope == "worker" else ""
            key = self.runtime.limit_key(limit.pattern, worker)
            label = f"limit:{limit.pattern}"
            n = concurrency_for(table, label, limit.n) or limit.n
            funnels.append(ConcurrencyFunnel(n, key, label, limit.variant))
        return funnels

    @staticmethod
    def variant(funnels: Sequence[ConcurrencyFunnel]) -> Variant:
        """The variant of a run's seats: the first one not the built-in, if any."""
        for funnel in funnels:
            if funnel.variant != SEATS:
                return variant_named(funnel.variant)
        return _VARIANTS[SEATS]

    def take(self, arrival: Arrival) -> tuple[Lease | None, Any]:
        """The lease of every seat ``arrival`` needs, or (None, what the gate returns)
        when it waits.

        Raises:
            Exception: what computing a key raised (the gate fails the task).
        """
        return self.variant(arrival.seats).take(self, arrival)

    def started(self, lease: Lease, request: Any) -> None:
        """The run of ``request`` holding ``lease`` goes to the pool."""
        self.variant(lease.funnels).started(self, lease, request)

    def free(self, lease: Lease) -> None:
        """The run holding ``lease`` will not start: free its seats."""
        self.variant(lease.funnels).free(self, lease)

    def wait(self, arrival: Arrival) -> Any:
        """``arrival`` was refused a seat: make it wait (what the gate returns)."""
        return self.variant(arrival.seats).wait(self, arrival)

    def lease(self, arrival: Arrival, *, held: bool = False, rank: int = 0) -> Lease | None:
        """Take every seat ``arrival`` needs, all or none: the lease, or None when it
        must wait (nothing taken; ``held``: it waits in this worker, queued as a held
        waiter of priority ``rank``, where a hand-off listener can wake it). Seats
        promised to it (handed while it waited parked) that it does not need here are
        given up.

        Raises:
            BackendError: when Redis fails.
        """
        self.runtime.outage.check()  # no call waits on a Redis known to fail
        request, funnels, renewal = arrival.request, arrival.seats, self.renewal
        elsewhere = [s for s in arrival.state.promised if s not in funnels]
        if elsewhere:  # handed a seat another worker counts: give it up there
            renewal.hand_on(renewal.store.free(elsewhere, request.id, "")[1])
        token = uuid.uuid4().hex
        try:
            lease, promoted = renewal.store.take(
                funnels, request.id, self.node, token, self._held_waiter(held, rank)
            )
        except BackendError:  # it may still take them (the call ran, its reply was lost)
            renewal.owe(Lease(request.id, token, tuple(funnels)))
            raise
        renewal.know(funnels)
        renewal.hand_on(promoted)
        return lease

    def _held_waiter(self, held: bool, rank: int) -> HeldWaiter | None:
        """How a run held here is queued, if it is (a listener to wake it is needed)."""
        if not held or self.hand_offs is None:
            return None
        self.hand_offs.start()
        return HeldWaiter(self.hand_offs.channel, HELD_MARK_SECONDS, rank)

    def queue(self, request: Any, funnels: Sequence[ConcurrencyFunnel], rank: int = 0) -> None:
        """``request`` was parked: queue it for a seat (it may get one at once), behind
        the waiters of its priority ``rank`` (the broker's order, 0 first).

        Raises:
            BackendError: when Redis fails.
        """
        renewal = self.renewal
        renewal.hand_on(renewal.store.queue(funnels, request.id, rank))

    @staticmethod
    def label(arrival: Arrival) -> str:
        """The seats ``arrival`` needs, as reports name them."""
        return "+".join(funnel.label for funnel in arrival.seats)

    def outage(self, arrival: Arrival, error: BackendError) -> Any:
        """The funnels' Redis failed taking a seat: the outage policy decides (run
        now, unlimited; fail; or hold for a back-off and try again)."""
        label = self.label(arrival)
        ruling = on_outage(self.runtime, arrival.subject, arrival.state, error, label)
        if ruling.run:
            return self.admit(arrival, None)
        if ruling.error is not None:
            return self.fail(arrival.request, ruling.error, True)
        return self.waits.wait(arrival, ruling)

    def forget(self, request: Any) -> None:
        """``request`` ends without running (revoked, expired): give up a seat handed
        to it while parked, and its place in the queue. Never raises."""
        try:
            funnels = self.of(request.type, request.name, request.args, request.kwargs)
            if funnels:
                renewal = self.renewal
                renewal.hand_on(renewal.store.free(funnels, request.id, "")[1])
        except Exception:  # the handed seat runs out after the TTL
            return

    def close(self) -> None:
        """The worker shuts down: stop renewing, give back what is still held."""
        if self.hand_offs is not None:
            self.hand_offs.stop()
        if self._renewal is not None:
            self._renewal.stop()
