"""``FunnelTask``: a Celery task base class that passes shared funnels before it runs.

On a worker with celery-funnel installed, the worker gate (``celery_funnel.worker``)
decides every run before it reaches the pool, over the task's own funnels and every
matching ``funnel_limits`` entry at once, and marks the runs it admitted, which
``before_start`` then lets through: each funnel is paid once per run. ``before_start``
is the gate of eager runs (``funnel_throttle_eager``) and of workers without it
(``_celery.in_task``): it calls the same gate core (``_shared.judge``); a refused task is
published again, for the time the funnel names, with everything it was sent with
(``_shared.publish``), and the current run ends with ``Ignore``. ``request.retries`` is
left alone and ``on_retry`` is not called: deferrals are counted in a header of their
own. What a run tells its funnels (``funnel_settle``, ``funnel_feedback``,
``funnel_backoff``) is ``_celery.feedback``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from celery import Task

from .._config.options import check_call, check_class, limits_of
from .._config.runtime import Runtime
from .._limiter.errors import BackendError
from .._limiter.headers import Upstream
from .._limiter.keys import safe_part
from .._limiter.limit import Limit, fixed
from .._shared.charges import Charge, Charges, OwnCharges
from .._shared.fair import fair_of
from .._shared.follow import follows_of
from .._shared.publish import gate_publishes
from .._shared.state import admitted_by_gate
from . import backlog, debounce, feedback, in_task, unique

__all__ = ["FunnelTask", "limits_of", "own_charges"]

logger = logging.getLogger("celery_funnel")


class FunnelTask(Task):  # type: ignore[misc]
    """Base class for tasks that share funnels: ``@app.task(base=FunnelTask,
    funnel_rate="30/m", funnel_capacity=15, funnel_key="{customer_id}")``.

    Options (also settable with ``task_annotations``): ``funnel_rate`` (``"N/s"``,
    ``"0.5/s"``, ``"5"``: read as Celery reads ``rate_limit``), ``funnel_capacity``
    (tasks that may start back to back from an idle funnel, default 1), ``funnel_key``
    (format string over the task's arguments, or a callable taking them; default: one
    funnel per task name), ``funnel_cost`` (units per task, int or callable; default 1),
    ``funnel_strategy`` (a registered strategy's name, ``strategies.names()``; default
    ``"gcra"``), and ``funnel_limits`` (more limits, as dicts with the same keys:
    ``rate``, ``capacity``, ``key``, ``cost``), all of which must admit the task at
    once (GCRA only), and
    ``funnel_on_backend_error`` (``"defer"``, ``"allow"`` or ``"raise"``; default: the
    app's setting) for when the funnel's Redis fails, and ``funnel_dry_run`` (default:
    the app's setting) to run every task at once and only report the deferrals;
    ``funnel_fair_by`` (format string or callable, like ``funnel_key``) shares the
    funnel between tenants round-robin, weighted by ``funnel_weights`` (a mapping
    tenant -> weight, or a callable; default 1), the highest priority first;
    ``funnel_concurrency`` (at most this many running at once across the workers, per
    ``funnel_key`` when set; enforced by the worker gate with leases, see the README);
    ``funnel_max_waiting`` (``delay``/``apply_async`` raise ``TooManyWaitingError``
    while this many tasks of the funnel, per ``funnel_key``, are sent and not started);
    ``funnel_unique=True`` (a send while a task of the same ``funnel_key`` waits or
    runs returns that task's ``AsyncResult``; ``funnel_unique_ttl`` seconds bound a
    dead holder) and ``funnel_debounce=seconds`` (sends of one ``funnel_key`` collapse
    into one run with the last send's arguments, ``seconds`` after the last send, at
    most ``funnel_debounce_max`` after the first); see docs/debounce.md.

    Subclasses that override ``before_start`` must call ``super().before_start``.

    Raises (in the task, which then fails): ``CostTooHighError`` when the cost can never
    fit, ``TooManyDeferralsError`` past ``funnel_max_deferrals``, ``BackendError`` when
    Redis fails.
    """

    funnel_rate: ClassVar[str | float | None] = None
    funnel_capacity: ClassVar[int] = 1
    funnel_strategy: ClassVar[str] = "gcra"
    funnel_key: ClassVar[Any] = None
    funnel_cost: ClassVar[Any] = 1
    funnel_limits: ClassVar[Any] = ()
    funnel_on_backend_error: ClassVar[str | None] = None  # None: the app's setting
    funnel_dry_run: ClassVar[bool | None] = None  # None: the app's setting
    funnel_fair_by: ClassVar[Any] = None
    funnel_weights: ClassVar[Any] = None
    funnel_concurrency: ClassVar[int | None] = None  # at most this many at once (worker gate)
    funnel_max_waiting: ClassVar[int | None] = None  # sends refused while this many wait
    funnel_unique: ClassVar[bool | None] = None  # one task per funnel_key waits or runs
    funnel_unique_ttl: ClassVar[float | None] = None  # seconds a dead holder keeps its key
    funnel_debounce: ClassVar[float | None] = None  # seconds without a send before it runs
    funnel_debounce_max: ClassVar[float | None] = None  # seconds after the first send, at most
    funnel_adaptive: ClassVar[Any] = None  # {"min": "1/s", ...}: the rate adapts to 429s

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_class(cls, FunnelTask)  # bad options fail where the task is defined

    def apply_async(self, args: Any = None, kwargs: Any = None, *more: Any, **options: Any) -> Any:
        """Celery's ``apply_async``, after refusing argument values that would make an
        unstable funnel key (``ConfigurationError``, raised at the call) and, with
        ``funnel_max_waiting=N``, while N tasks of its funnel wait to start
        (``TooManyWaitingError``: nothing is sent). A unique task whose key is held
        returns the holder's ``AsyncResult``; a debounced one stores its send and
        returns its window's (nothing is published now)."""
        if gate_publishes():  # the gate's own publish of a task sent already
            return super().apply_async(args, kwargs, *more, **options)
        check_call(self, args, kwargs)
        waiting = debounce.send(self, args, kwargs, options)
        if waiting is None:
            waiting = unique.claim(self, args, kwargs, options)
        if waiting is not None:
            return waiting
        try:
            if not follows_of(options.get("headers")):  # a follower runs no body of its own
                backlog.enter(self, args, kwargs, options)
            return super().apply_async(args, kwargs, *more, **options)
        except BaseException:
            if options.get("task_id") is not None:  # not sent: it does not wait
                backlog.leave(self, options["task_id"], args, kwargs)
                unique.free(self, options["task_id"], args, kwargs)
            raise

    def before_start(self, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        super().before_start(task_id, args, kwargs)
        in_task.decide(self, task_id, args, kwargs)
        if self.funnel_max_waiting is not None:  # it starts: it no longer waits
            try:
                backlog.leave(self, task_id, args, kwargs)
            except BackendError as error:  # its entry stops counting within the hour
                logger.warning("celery-funnel: task %s[%s] left no backlog: %s", self.name,
                               task_id, error)  # fmt: skip

    def funnel_backoff(self, seconds: float) -> None:
        """The upstream refused this task (an HTTP 429 with Retry-After, say): hold the
        task's funnels for ``seconds`` for every worker, and defer this task until then.
        ``seconds`` of 0 or less ("Retry-After: 0") holds nothing: the task books afresh.
        Its adaptive funnels (``"adaptive"`` in a limit) lower their rate.

        Call it from the task body; it does not return (it ends the run with
        ``Ignore``, the task being published again). Needs GCRA funnels.

        Raises:
            ConfigurationError: when the task has no GCRA funnel.
        """
        feedback.backoff(self, seconds)

    def funnel_settle(self, actual: int | None = None, /, **named: int) -> bool:
        """Replace what this run was charged at admission with what it really used:
        ``actual`` units on the task's own funnel (its ``funnel_rate``, or its one
        limit), and ``name=units`` on the limits named so (``"name"`` in
        ``funnel_limits``, the task's or a worker-wide one that charged it). The
        difference is given back, or charged on top, at once for every worker, in one
        round trip for every funnel named.

        Settling again settles relative to the last call: a funnel always holds the
        last amount said. A give-back never goes below an idle funnel (units charged
        to a funnel that drained meanwhile are gone). A run that ends without settling
        keeps its estimate charged. A direct call, or an eager run that was not
        throttled, was charged nothing: settling does nothing there.

        Returns False (and logs a warning) when the funnels' Redis failed: the
        estimate then stays charged. Only GCRA funnels can be settled.

        Raises:
            ConfigurationError: an unknown name, no funnel of the task's own for
                ``actual``, units that are not an integer >= 0, a window strategy.
        """
        return feedback.settle(self, actual, named)

    def funnel_feedback(
        self, headers: Any, status: int | None = None, *, names: Mapping[str, str] | None = None
    ) -> Upstream:
        """Bring this task's named funnels in line with an upstream's rate-limit
        ``headers`` (``Retry-After``, IETF ``RateLimit``, ``x-ratelimit-*``,
        ``anthropic-ratelimit-*``; see ``celery_funnel.read_headers``): each funnel
        named as one of the upstream's limits (``requests``, ``tokens``,
        ``input_tokens``...; ``names`` maps theirs to ours) admits no more than the
        upstream says remains, for every worker, in one round trip. A funnel is never
        made more generous than its own limit.

        A funnel with ``"adaptive"`` in its limit takes ``status`` as a signal: a
        2xx lets its rate climb, a 429 lowers it (see docs/llm.md).

        With ``status`` 429 it then holds the task's funnels for the ``Retry-After``
        (else until the latest reset of an exhausted limit, else 1 s) as
        ``funnel_backoff`` does, and does not return (the task is deferred).

        Returns the headers read. A failure of the funnels' Redis is logged, not raised.
        """
        return feedback.feedback(self, headers, status, names)

    def _funnel_paid(self, runtime: Runtime) -> list[Charge] | None:
        """The charges this run paid at admission (None: it paid nothing, a direct
        call or an eager run not throttled): the worker gate paid the worker-wide ones
        too, ``before_start`` the task's own."""
        request = self.request
        if request.called_directly or (request.is_eager and not runtime.settings.throttle_eager):
            return None
        args, kwargs = request.args or (), request.kwargs or {}
        if admitted_by_gate(request.headers):
            hostname = safe_part(request.hostname or "worker")
            return Charges(runtime, self.app, hostname, own_charges).of(
                self.name, self.name, args, kwargs
            )
        return self._funnel_charges(runtime, args, kwargs)

    def _funnel_limits(self) -> tuple[Limit, ...]:
        if "_funnel_limits_cache" not in self.__dict__:
            self.__dict__["_funnel_limits_cache"] = limits_of(self)
        limits: tuple[Limit, ...] = self.__dict__["_funnel_limits_cache"]
        return limits

    def _funnel_keys(
        self,
        runtime: Runtime,
        limits: Sequence[Limit],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> list[str]:
        if len(limits) == 1:
            return [runtime.task_key(self.name, limits[0].key_part(self.run, args, kwargs))]
        # several limits are checked in one script: the key layout gives them one slot
        return [
            runtime.task_key(self.name, limit.key_part(self.run, args, kwargs), i)
            for i, limit in enumerate(limits)
        ]

    def _funnel_charges(
        self, runtime: Runtime, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> list[Charge]:
        """What one run with ``args``/``kwargs`` pays on the task's own funnels."""
        limits = self._funnel_limits()
        if not limits:
            return []
        known = self.__dict__.get("_funnel_fixed_charges")
        if known is not None and known[0] is runtime:  # every run pays alike: built once
            return list(known[1])
        keys = self._funnel_keys(runtime, limits, args, kwargs)
        run, name = self.run, self.name
        charges = [
            Charge(limit, key, limit.cost_of(args, kwargs), name, fair_of(limit, run, args, kwargs))
            for limit, key in zip(limits, keys, strict=True)
        ]
        if all(fixed(limit) for limit in limits):
            self.__dict__["_funnel_fixed_charges"] = (runtime, tuple(charges))
        return charges


def own_charges(task: Any) -> OwnCharges | None:
    """What a run of ``task`` pays on its own funnels (a FunnelTask's ``funnel_*``
    options), handed to the gate's ``Charges``; None: nothing (not a FunnelTask)."""
    own: OwnCharges | None = getattr(task, "_funnel_charges", None)
    return own
