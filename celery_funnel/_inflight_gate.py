"""The worker gate's decisions in flight (``InFlightSteps``, mixed into
``worker.WorkerGate``): send a request's decision without waiting (``_inflight``) and
carry the request on when the reply comes, through the same steps as a decision waited
for."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from ._gate import Charge, State, Step, Subject, judge
from ._inflight import InFlight
from ._leases import Lease
from ._live import Live
from ._runtime import Runtime

__all__ = ["InFlightSteps"]


class InFlightSteps:
    """What the worker gate does with a decision sent without waiting."""

    runtime: Runtime
    live: Live
    inflight: InFlight

    if TYPE_CHECKING:  # the worker gate's own

        def _subject(self, request: Any) -> Subject:
            raise NotImplementedError

        def _decide(self, request: Any, charges: Sequence[Charge], state: State) -> Step:
            raise NotImplementedError

        # (request, charges, state, step, lease) -> what on_task_request returns
        _decided: Callable[[Any, Sequence[Charge], State, Step, Lease | None], Any]

        def _fail(self, request: Any, error: BaseException, *, reported: bool) -> None:
            raise NotImplementedError

    def _send(self, request: Any, charges: Sequence[Charge], state: State) -> bool:
        """Send the decision without waiting for it (``_inflight``), when it is one
        script call: not for fair-share funnels (their step is not one call) nor paused
        ones (decided here, no call). Only a first arrival's, and only while no task
        was deferred lately (``_inflight.CALM_SECONDS``): a task that waits comes back
        to redeem its slot at its time, decided as before."""
        if state.deferrals or not self.inflight.on or any(c.fair for c in charges):
            return False
        if self.live.overrides.paused(charges) is not None:
            return False
        decide = partial(
            judge, self.runtime, self._subject(request), self.live.overrides.apply(charges), state
        )
        call, _ = self.inflight.capture(lambda store: decide(funnel=store))
        if call is None:  # decided without Redis: decide again the ordinary way
            return False
        try:
            self.inflight.send(call, partial(self._resume, request, charges, state, decide))
        except (RedisError, OSError):  # the ordinary way, with the outage policy
            return False
        return True

    def _resume(
        self,
        request: Any,
        charges: Sequence[Charge],
        state: State,
        decide: Callable[..., Step],
        reply: Any,
    ) -> Any:
        """Carry ``request`` on with its decision's ``reply`` (an exception: decide it
        again the ordinary way)."""
        try:
            if isinstance(reply, BaseException):
                step = self._decide(request, charges, state)
            else:
                step = decide(funnel=self.inflight.replay(reply, self.runtime.funnel._eval))
        except Exception as error:  # one task fails, the worker runs on
            return self._fail(request, error, reported=False)
        return self._decided(request, charges, state, step, None)
