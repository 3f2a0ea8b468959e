"""``FunnelTask``: a Celery task base class that passes shared funnels before it runs.

The gate is ``before_start``, which the worker's tracer runs inside the ``try`` that
handles ``Ignore``: a refused task is published again, for the time the funnel names,
through ``signature_from_request`` (same id, headers, priority, queue, chain, links,
group and chord), and the current run ends with ``Ignore``. ``request.retries`` is left
alone and ``on_retry`` is not called: deferrals are counted in a header of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore

from ._errors import BackendError, ConfigurationError, CostTooHighError, TooManyDeferralsError
from ._limit import Limit, Verdict, check_all
from ._outage import backoff
from ._runtime import Runtime, runtime_for
from ._task_options import (
    HEADER,
    Deferral,
    check_call,
    check_class,
    dry_run_of,
    limits_of,
    policy_of,
)

__all__ = ["HEADER", "FunnelTask", "limits_of"]


class FunnelTask(Task):  # type: ignore[misc]
    """Base class for tasks that share funnels: ``@app.task(base=FunnelTask,
    funnel_rate="30/m", funnel_capacity=15, funnel_key="{customer_id}")``.

    Options (also settable with ``task_annotations``): ``funnel_rate`` (``"N/s"`` …),
    ``funnel_capacity`` (tasks that may start back to back from an idle funnel,
    default 1), ``funnel_key`` (format string over the task's arguments, or a callable
    taking them; default: one funnel per task name), ``funnel_cost`` (units per task,
    int or callable; default 1), ``funnel_strategy`` (``"gcra"`` default, or
    ``"fixed_window"``, ``"sliding_window"``, ``"sliding_log"``), and ``funnel_limits``
    (more limits, as dicts with the same keys: ``rate``, ``capacity``, ``key``,
    ``cost``), all of which must admit the task at once (GCRA only), and
    ``funnel_on_backend_error`` (``"defer"``, ``"allow"`` or ``"raise"``; default: the
    app's setting) for when the funnel's Redis fails, and ``funnel_dry_run`` (default:
    the app's setting) to run every task at once and only report the deferrals.

    Subclasses that override ``before_start`` must call ``super().before_start``.

    Raises (in the task, which then fails): ``CostTooHighError`` when the cost can never
    fit, ``TooManyDeferralsError`` past ``funnel_max_deferrals``, ``BackendError`` when
    Redis fails.
    """

    funnel_rate: ClassVar[str | None] = None
    funnel_capacity: ClassVar[int] = 1
    funnel_strategy: ClassVar[str] = "gcra"
    funnel_key: ClassVar[Any] = None
    funnel_cost: ClassVar[Any] = 1
    funnel_limits: ClassVar[Any] = ()
    funnel_on_backend_error: ClassVar[str | None] = None  # None: the app's setting
    funnel_dry_run: ClassVar[bool | None] = None  # None: the app's setting

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_class(cls, FunnelTask)  # bad options fail where the task is defined

    def apply_async(self, args: Any = None, kwargs: Any = None, *more: Any, **options: Any) -> Any:
        """Celery's ``apply_async``, after refusing argument values that would make an
        unstable funnel key (``ConfigurationError``, raised at the call)."""
        check_call(self, args, kwargs)
        return super().apply_async(args, kwargs, *more, **options)

    def before_start(self, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        super().before_start(task_id, args, kwargs)
        request = self.request
        runtime = runtime_for(self.app)
        if request.called_directly or (request.is_eager and not runtime.settings.throttle_eager):
            return
        limits = self._funnel_limits()
        if not limits:
            return
        dry_run = dry_run_of(self, runtime.settings.dry_run)
        while True:
            check = partial(self._funnel_check, runtime, limits, task_id, args, kwargs, dry_run)
            verdict = self._funnel_verdict(runtime, task_id, dry_run, check)
            if verdict is None or verdict.run:
                return
            if dry_run:  # record what a real funnel would have done, and run
                runtime.observer.deferred(
                    self.name, task_id, self.name, verdict.delay, dry_run=True
                )
                return
            if verdict.never:
                costs = [limit.cost_of(args, kwargs) for limit in limits]
                raise self._funnel_refused(runtime, CostTooHighError(
                    f"task {self.name}[{task_id}] costs {costs} units but its funnels hold"
                    f" {[limit.capacity for limit in limits]}: it can never run"
                ))  # fmt: skip
            if not request.is_eager and not runtime.countdowns.waits_in_place(verdict.delay):
                self._funnel_defer(runtime, args, kwargs, verdict)
            # eager mode (throttled on purpose), or under a second on a broker that
            # delays by whole seconds only: wait in place, then redeem the slot
            state = Deferral.from_headers(request.headers)
            runtime.observer.deferred(
                self.name, task_id, self.name, verdict.delay,
                deferrals=state.deferrals + 1, booked=verdict.booked, outage=verdict.outage,
            )  # fmt: skip
            time.sleep(verdict.delay)
            if verdict.booked:
                request.headers = {
                    **(request.headers or {}),
                    HEADER: state._replace(booked=True).header(),
                }

    def funnel_backoff(self, seconds: float) -> None:
        """The upstream refused this task (an HTTP 429 with Retry-After, say): hold the
        task's funnels for ``seconds`` for every worker, and defer this task until then.

        Call it from the task body; it does not return (it ends the run with
        ``Ignore``, the task being published again). Needs GCRA funnels.

        Raises:
            ConfigurationError: when the task has no GCRA funnel.
        """
        request = self.request
        limits = self._funnel_limits()
        if not limits or limits[0].strategy != "gcra":
            raise ConfigurationError(
                f"funnel_backoff needs a GCRA funnel on task {self.name!r}"
                f" (funnel_rate set, funnel_strategy 'gcra')"
            )
        runtime = runtime_for(self.app)
        args, kwargs = request.args or (), request.kwargs or {}
        keys = self._funnel_keys(runtime, limits, args, kwargs)
        for limit, key in zip(limits, keys, strict=True):
            rate = limit.rate
            runtime.funnel.hold(key, limit.capacity - 1, rate.count, rate.period, seconds)
        # the hold voided every booking, this task's too: it books afresh on return
        self._funnel_defer(runtime, args, kwargs, Verdict(run=False, delay=seconds))

    def _funnel_verdict(
        self, runtime: Runtime, task_id: str, dry_run: bool, check: Callable[[], Verdict]
    ) -> Verdict | None:
        """``check()``, the decision over every limit of the task, with the outage
        policy and the reports around it: None to run the task unchecked."""
        try:
            verdict = check()
        except BackendError as error:
            return self._funnel_outage(runtime, error, dry_run)
        runtime.outage.answered()
        if verdict.run:
            runtime.observer.admitted(self.name, task_id, self.name, dry_run=dry_run)
        return verdict

    def _funnel_refused(self, runtime: Runtime, error: Exception) -> Exception:
        runtime.observer.refused(self.name, self.request.id, self.name, error)
        return error

    def _funnel_outage(
        self, runtime: Runtime, error: BackendError, dry_run: bool = False
    ) -> Verdict | None:
        """The funnel's Redis failed: None to run the task anyway ("allow", or a dry
        run), a back-off to defer it ("defer"), or the error again ("raise", and in
        eager mode)."""
        policy = policy_of(self, runtime.settings.on_backend_error)
        runtime.outage.failed(error, policy)
        if policy == "allow" or dry_run:
            return None
        if policy == "raise" or self.request.is_eager:
            raise self._funnel_refused(runtime, error)
        state = Deferral.from_headers(self.request.headers)
        delay = backoff(state.outages, runtime.countdowns.cap)
        return Verdict(run=False, delay=delay, booked=state.booked, outage=True)

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

    def _funnel_check(
        self,
        runtime: Runtime,
        limits: Sequence[Limit],
        task_id: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        dry_run: bool = False,
    ) -> Verdict:
        keys = self._funnel_keys(runtime, limits, args, kwargs)
        costs = [limit.cost_of(args, kwargs) for limit in limits]
        state = Deferral.from_headers(self.request.headers)
        gcra = all(limit.strategy == "gcra" for limit in limits)
        # a dry run books nothing: a refused task runs anyway and takes no slot
        ticket = task_id if runtime.settings.reservation and gcra and not dry_run else None
        late = None
        if ticket is not None:  # one slot's width, doubled each time the ticket went stale
            widths = [
                limit.rate.period / limit.rate.count * max(cost, 1)
                for limit, cost in zip(limits, costs, strict=True)
            ]
            late = max(widths) * 2**state.stale
        if len(limits) == 1:
            return limits[0].check(
                runtime.funnel, keys[0], costs[0], ticket=ticket, redeem=state.booked, late=late
            )
        return check_all(
            runtime.funnel, limits, keys, costs, ticket=ticket, redeem=state.booked, late=late
        )

    def _funnel_defer(
        self, runtime: Runtime, args: Sequence[Any], kwargs: Mapping[str, Any], verdict: Verdict
    ) -> None:
        request = self.request
        state = Deferral.from_headers(request.headers)
        deferral = Deferral(
            state.deferrals + 1,
            verdict.booked,
            state.stale + verdict.stale,
            state.outages + 1 if verdict.outage else 0,
        )
        cap = runtime.settings.max_deferrals
        if cap is not None and deferral.deferrals > cap:
            raise self._funnel_refused(runtime, TooManyDeferralsError(
                f"task {self.name}[{request.id}] was deferred {state.deferrals} times"
                f" (funnel_max_deferrals={cap})"
            ))  # fmt: skip
        headers = {**(request.headers or {}), HEADER: deferral.header()}
        countdown = runtime.countdowns.countdown(verdict.delay)
        runtime.observer.deferred(
            self.name, request.id, self.name, verdict.delay,
            deferrals=deferral.deferrals, booked=verdict.booked, outage=verdict.outage,
            requeued=True, send_event=self.send_event if runtime.observer.events else None,
        )  # fmt: skip
        self.signature_from_request(
            request, args, kwargs, countdown=countdown, headers=headers
        ).apply_async()
        raise Ignore()
