"""One request as the worker gate sees it on one pass: read once, passed on to every
step (slots, decision, waits) instead of each step reading the request again."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .._config.options import dry_run_of, policy_of
from .._config.runtime import Runtime
from .._limiter.fair import rank
from .._stores.leases import SlotFunnel
from .charging import Charge, FairAdmit
from .judge import State, Subject, label_of
from .requests import until_expiry

__all__ = ["Arrival", "subject_of"]


class Arrival(NamedTuple):
    """``request`` (a Celery worker Request) on this pass: the funnels it is charged
    (``charges``), the concurrency slots it needs (``slot_funnels``), the ``state`` its header
    carried, and the ``subject`` judged (name, id, outage policy, expiry)."""

    request: Any
    charges: Sequence[Charge]
    slot_funnels: Sequence[SlotFunnel]
    state: State
    subject: Subject

    @property
    def label(self) -> str:
        """The funnels it is charged, as reports name them."""
        return label_of(self.charges)


def subject_of(
    runtime: Runtime,
    request: Any,
    own_options: Callable[[Any], bool],
    fair: FairAdmit | None,
    transport: str,
) -> Subject:
    """The subject ``request`` is judged as: its task's own ``funnel_on_backend_error``
    and ``funnel_dry_run`` where ``own_options(task)`` (a FunnelTask), else the settings';
    seconds until it expires; ``fair``: the fair-share step (None: none); its priority
    rank in the order of the broker's ``transport`` ("redis", "amqp" ...)."""
    settings = runtime.settings
    task = request.task
    until = until_expiry(request)
    expires_in = None if math.isinf(until) else until
    if own_options(task):
        policy = policy_of(task, settings.on_backend_error)
        dry_run = dry_run_of(task, settings.dry_run)
    else:
        policy, dry_run = settings.on_backend_error, settings.dry_run
    priority = rank(transport, (request.delivery_info or {}).get("priority"))
    return Subject(
        request.name, request.id, policy, dry_run, expires_in=expires_in, fair=fair,
        rank=priority,
    )  # fmt: skip
