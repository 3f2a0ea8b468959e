"""One request as the worker gate sees it on one pass: read once, passed on to every
phase (seats, decision, waits) instead of each phase reading the request again."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .._config.options import dry_run_of, policy_of
from .._config.runtime import Runtime
from .._limiter.fair import rank
from .._shared.charges import Charge, label_of
from .._shared.charges_decide import FairAdmit
from .._shared.delivery import Delivery, until_expiry
from .._shared.judge import Subject
from .._shared.state import State
from .._stores.concurrency import ConcurrencyFunnel

__all__ = ["Arrival", "TaskOptions", "subject_of"]


class Arrival(NamedTuple):
    """``request`` (a Celery worker Request) on this pass: the funnels it is charged
    (``charges``), the seats it needs (``seats``: one per concurrency funnel), the
    ``state`` its header carried, the ``subject`` judged (name, id, outage policy,
    expiry) and its ``delivery`` (how long this worker may keep it; whether its copy was
    accepted)."""

    request: Any
    charges: Sequence[Charge]
    seats: Sequence[ConcurrencyFunnel]
    state: State
    subject: Subject
    delivery: Delivery

    @property
    def label(self) -> str:
        """The funnels it is charged, as reports name them."""
        return label_of(self.charges)


class TaskOptions:
    """A task's outage policy and dry run: its own ``funnel_on_backend_error`` and
    ``funnel_dry_run`` where ``own_options(task)`` (a FunnelTask), else the settings';
    read once per task type (neither changes while the worker runs)."""

    def __init__(self, runtime: Runtime, own_options: Callable[[Any], bool]) -> None:
        self.runtime, self.own_options = runtime, own_options
        self._known: dict[str, tuple[str, bool]] = {}

    def __call__(self, task: Any) -> tuple[str, bool]:
        """``(policy, dry_run)`` of ``task``.

        Raises:
            ConfigurationError: a bad option value (read again next time).
        """
        known = self._known.get(task.name)
        if known is None:
            known = self._known[task.name] = self._read(task)
        return known

    def _read(self, task: Any) -> tuple[str, bool]:
        settings = self.runtime.settings
        if not self.own_options(task):
            return settings.on_backend_error, settings.dry_run
        return policy_of(task, settings.on_backend_error), dry_run_of(task, settings.dry_run)


def subject_of(
    request: Any, options: TaskOptions, fair: FairAdmit | None, transport: str
) -> Subject:
    """The subject ``request`` is judged as: its task's ``options`` (outage policy, dry
    run); seconds until it expires; ``fair``: how a fair-share charge is admitted (None: none); its
    priority rank in the order of the broker's ``transport`` ("redis", "amqp" ...)."""
    expires_in = None if request.expires is None else until_expiry(request)
    policy, dry_run = options(request.task)
    priority = rank(transport, (request.delivery_info or {}).get("priority"))
    return Subject(
        request.name, request.id, policy, dry_run, expires_in=expires_in, fair=fair,
        rank=priority,
    )  # fmt: skip
