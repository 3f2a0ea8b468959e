"""``FunnelTask``: a Celery task base class that passes a shared funnel before it runs.

The gate is ``before_start``, which the worker's tracer runs inside the ``try`` that
handles ``Ignore``: a refused task is published again, for the time the funnel names,
through ``signature_from_request`` (same id, headers, priority, queue, chain, links,
group and chord), and the current run ends with ``Ignore``. ``request.retries`` is left
alone and ``on_retry`` is not called: deferrals are counted in a header of their own.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from celery import Task
from celery.exceptions import Ignore

from ._errors import ConfigurationError, CostTooHighError, TooManyDeferralsError
from ._limit import Limit, Verdict, parse_limit, safe_part
from ._runtime import Runtime, runtime_for

__all__ = ["HEADER", "FunnelTask"]

HEADER = "celery_funnel"
_OPTIONS = ("funnel_rate", "funnel_capacity", "funnel_strategy", "funnel_key", "funnel_cost")


class Deferral(NamedTuple):
    """What the header carries from one run of a task to the next."""

    deferrals: int = 0  # times deferred so far
    booked: bool = False  # a slot is booked under the task id
    stale: int = 0  # times its ticket came too late (the late grace doubles each time)

    @classmethod
    def from_headers(cls, headers: Mapping[str, Any] | None) -> Deferral:
        raw = (headers or {}).get(HEADER) or {}
        return cls(int(raw.get("deferrals", 0)), bool(raw.get("booked")), int(raw.get("stale", 0)))

    def header(self) -> dict[str, Any]:
        return self._asdict()


def _option(task: Any, name: str) -> Any:
    # Read without binding: a function stored as a class attribute (funnel_key=lambda
    # ...) would otherwise come back as a method of the task.
    value = inspect.getattr_static(task, name, None)
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def limit_of(task: Any) -> Limit | None:
    """The task's limit from its ``funnel_*`` options (``task_annotations`` included)."""
    if _option(task, "funnel_rate") is None:
        return None
    spec = {
        "rate": _option(task, "funnel_rate"),
        "capacity": _option(task, "funnel_capacity"),
        "strategy": _option(task, "funnel_strategy"),
        "key": _option(task, "funnel_key"),
        "cost": _option(task, "funnel_cost"),
    }
    try:
        return parse_limit(spec, where=f"task {getattr(task, 'name', task)!r}")
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} (funnel_* options of the task)") from None


class FunnelTask(Task):  # type: ignore[misc]
    """Base class for tasks that share a funnel: ``@app.task(base=FunnelTask,
    funnel_rate="30/m", funnel_capacity=15, funnel_key="{customer_id}")``.

    Options (also settable with ``task_annotations``): ``funnel_rate`` (``"N/s"`` …),
    ``funnel_capacity`` (tasks that may start back to back from an idle funnel,
    default 1), ``funnel_key`` (format string over the task's arguments, or a callable
    taking them; default: one funnel per task name), ``funnel_cost`` (units per task,
    int or callable; default 1), ``funnel_strategy`` (``"gcra"`` default, or
    ``"fixed_window"``, ``"sliding_window"``, ``"sliding_log"``).

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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if any(option in cls.__dict__ for option in _OPTIONS):
            limit_of(cls)  # bad options fail where the task is defined

    def before_start(self, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        super().before_start(task_id, args, kwargs)
        request = self.request
        runtime = runtime_for(self.app)
        if request.called_directly or (request.is_eager and not runtime.settings.throttle_eager):
            return
        limit = self._funnel_limit()
        if limit is None:
            return
        while True:
            verdict, cost, key = self._funnel_check(runtime, limit, task_id, args, kwargs)
            if verdict.run:
                return
            if verdict.never:
                raise CostTooHighError(
                    f"task {self.name}[{task_id}] costs {cost} units but funnel {key!r} holds"
                    f" {limit.capacity}: it can never run"
                )
            if not request.is_eager and not runtime.countdowns.waits_in_place(verdict.delay):
                self._funnel_defer(runtime, args, kwargs, verdict)
            # eager mode (throttled on purpose), or under a second on a broker that
            # delays by whole seconds only: wait in place, then redeem the slot
            time.sleep(verdict.delay)
            if verdict.booked:
                self.request.headers = {
                    **(self.request.headers or {}),
                    HEADER: Deferral(
                        Deferral.from_headers(request.headers).deferrals, True, 0
                    ).header(),
                }

    def funnel_backoff(self, seconds: float) -> None:
        """The upstream refused this task (an HTTP 429 with Retry-After, say): hold the
        task's funnel for ``seconds`` for every worker, and defer this task until then.

        Call it from the task body; it does not return (it ends the run with
        ``Ignore``, the task being published again). Needs the ``"gcra"`` strategy.

        Raises:
            ConfigurationError: when the task has no GCRA funnel.
        """
        request = self.request
        limit = self._funnel_limit()
        if limit is None or limit.strategy != "gcra":
            raise ConfigurationError(
                f"funnel_backoff needs a GCRA funnel on task {self.name!r}"
                f" (funnel_rate set, funnel_strategy 'gcra')"
            )
        runtime = runtime_for(self.app)
        args, kwargs = request.args or (), request.kwargs or {}
        rate = limit.rate
        runtime.funnel.hold(
            self._funnel_key(runtime, limit, args, kwargs), limit.capacity - 1,
            rate.count, rate.period, seconds,
        )  # fmt: skip
        # the hold voided every booking, this task's too: it books afresh on return
        self._funnel_defer(runtime, args, kwargs, Verdict(run=False, delay=seconds))

    def _funnel_key(
        self, runtime: Runtime, limit: Limit, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str:
        if "_funnel_key_base" not in self.__dict__:
            self.__dict__["_funnel_key_base"] = safe_part(self.name)
        return runtime.key(
            self.__dict__["_funnel_key_base"], limit.key_part(self.run, args, kwargs)
        )

    def _funnel_limit(self) -> Limit | None:
        if "_funnel_limit_cache" not in self.__dict__:
            self.__dict__["_funnel_limit_cache"] = limit_of(self)
        limit: Limit | None = self.__dict__["_funnel_limit_cache"]
        return limit

    def _funnel_check(
        self,
        runtime: Runtime,
        limit: Limit,
        task_id: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> tuple[Verdict, int, str]:
        key = self._funnel_key(runtime, limit, args, kwargs)
        cost = limit.cost_of(args, kwargs)
        state = Deferral.from_headers(self.request.headers)
        ticket = task_id if runtime.settings.reservation and limit.strategy == "gcra" else None
        late = None
        if ticket is not None:
            late = limit.rate.period / limit.rate.count * max(cost, 1) * 2**state.stale
        verdict = limit.check(
            runtime.funnel, key, cost, ticket=ticket, redeem=state.booked, late=late
        )
        return verdict, cost, key

    def _funnel_defer(
        self, runtime: Runtime, args: Sequence[Any], kwargs: Mapping[str, Any], verdict: Verdict
    ) -> None:
        request = self.request
        state = Deferral.from_headers(request.headers)
        deferral = Deferral(state.deferrals + 1, verdict.booked, state.stale + verdict.stale)
        cap = runtime.settings.max_deferrals
        if cap is not None and deferral.deferrals > cap:
            raise TooManyDeferralsError(
                f"task {self.name}[{request.id}] was deferred {state.deferrals} times"
                f" (funnel_max_deferrals={cap})"
            )
        headers = {**(request.headers or {}), HEADER: deferral.header()}
        countdown = runtime.countdowns.countdown(verdict.delay)
        self.signature_from_request(
            request, args, kwargs, countdown=countdown, headers=headers
        ).apply_async()
        raise Ignore()
