"""What the gate's concurrency (``_gate.concurrency.Concurrency``) is handed from above
``_gate`` by ``_celery.services``, as the gate sees it: the renewal service
(``Renewal``, made per app and worker by a ``RenewalOf``) and the hand-off listener
(``HandOffs``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .._stores.concurrency import ConcurrencyFunnel, ConcurrencyStore, Handed, Lease

__all__ = ["HandOffs", "Renewal", "RenewalOf"]


class Renewal(Protocol):
    """This worker's leases, renewed while their runs run: the renewal service
    (``_celery.concurrency_renewal.RenewalService``), handed to the gate by
    ``_celery.services``."""

    store: ConcurrencyStore

    def hand_on(self, handed: list[Handed]) -> None: ...
    def owe(self, lease: Lease) -> None: ...
    def know(self, funnels: Iterable[ConcurrencyFunnel]) -> None: ...
    def track(self, lease: Lease, request: Any) -> None: ...
    def end(self, task_id: str, lease: Lease | None = None, *, force: bool = False) -> None: ...
    def stop(self) -> None: ...


RenewalOf = Callable[[Any, str], Renewal]
"""The renewal service of an app in this process, for a worker's node name."""


class HandOffs(Protocol):
    """This worker's hand-off listener (``_celery.concurrency_handoff``): told on
    ``channel`` that a held waiter was handed a seat, it wakes it; started at the first
    held waiter."""

    channel: str

    def start(self) -> None: ...
    def stop(self) -> None: ...
