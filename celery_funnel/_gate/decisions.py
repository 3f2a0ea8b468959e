"""Decisions in flight (``InFlightDecisions``): the worker gate sends a run's decision
without waiting (``inflight``) and carries the run on when the reply comes, through the
same steps as a decision waited for."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any

from redis.exceptions import RedisError

from .._config.runtime import Runtime
from .._limiter.scripts import Call
from .._stores.leases import Lease
from .arrival import Arrival
from .inflight import InFlight
from .judge import Charge, Ruling, State, Subject, judge
from .live import Live

__all__ = ["STAND_IN", "InFlightDecisions"]

# What a call captured for the calls cache carries where the task id goes: no task id is
# this string (Celery's are UUIDs; a user's own ids are printable)
STAND_IN = "\x00celery-funnel:task-id"
CALLS = 1024  # the calls cache's bound: one entry per set of charges and state
_UNSEEN: Any = object()  # a key the calls cache has not seen

Decide = Callable[[Arrival], Ruling]  # decide the ordinary way (waiting for Redis)
Decided = Callable[[Arrival, Ruling, "Lease | None"], Any]  # act on a decision
Fail = Callable[[Any, BaseException, bool], Any]  # fail the request (reported or not)


class InFlightDecisions:
    """The decisions of one worker gate sent without waiting: ``decide`` decides a run
    the ordinary way, ``decided`` acts on a decision, ``fail`` fails a request."""

    def __init__(
        self, runtime: Runtime, live: Live, inflight: InFlight,
        decide: Decide, decided: Decided, fail: Fail,
    ) -> None:  # fmt: skip
        self.runtime, self.live, self.inflight = runtime, live, inflight
        self.decide, self.decided, self.fail = decide, decided, fail
        # the call per charges, state and subject, task id aside
        self.calls: dict[Hashable, Call | None] = {}

    def send(self, arrival: Arrival) -> bool:
        """Send ``arrival``'s decision without waiting for it, when it is one script
        call: not for fair-share funnels (their step is not one call) nor paused ones
        (decided here, no call). Only a first arrival's, and only while no task was
        deferred lately (``inflight.CALM_SECONDS``): a task that waits comes back to
        redeem its slot at its time, decided as before."""
        charges, state = arrival.charges, arrival.state
        if state.deferrals or not self.inflight.on or any(c.fair for c in charges):
            return False
        if self.live.overrides.paused(charges) is not None:
            return False
        subject, charges = arrival.subject, self.live.apply(charges)
        decide = partial(judge, self.runtime, subject, charges, state)
        call = self.call(subject, charges, state)
        if call is None:  # decided without Redis: decide again the ordinary way
            return False
        try:
            self.inflight.send(call, partial(self._resume, arrival, decide))
        except (RedisError, OSError):  # the ordinary way, with the outage policy
            return False
        return True

    def call(self, subject: Subject, charges: Sequence[Charge], state: State) -> Call | None:
        """The one script call judging ``subject`` makes (None: it makes none). It
        differs between runs of the same charges and state only by the task id (the
        ticket), so it is captured once, with a stand-in id, and reused with the task's:
        deciding twice per task (capture, then replay on the reply) cost about a sixth
        of the gate's time. The reply is still decoded by the decision replayed."""
        own = partial(self._judge, subject, charges, state)
        if subject.expires_in is not None:  # max_wait: the task's own
            return self.inflight.capture(own)[0]
        key: Hashable = (tuple(charges), state, subject.policy, subject.dry_run, subject.rank)
        try:  # one lookup: hashing the key is a good part of a never-limited task's cost
            template = self.calls.get(key, _UNSEEN)
        except TypeError:  # an unhashable option value (a mapping): captured each time
            return self.inflight.capture(own)[0]
        if template is _UNSEEN:
            if len(self.calls) >= CALLS:
                self.calls.clear()
            stand_in = dataclasses.replace(subject, task_id=STAND_IN)
            template, _ = self.inflight.capture(partial(self._judge, stand_in, charges, state))
            self.calls[key] = template
        if template is None:
            return None
        script, keys, args = template
        task_id = subject.task_id
        return script, keys, [task_id if arg == STAND_IN else arg for arg in args]

    def _judge(
        self, subject: Subject, charges: Sequence[Charge], state: State, store: Any
    ) -> Ruling:
        return judge(self.runtime, subject, charges, state, funnel=store)

    def _resume(self, arrival: Arrival, decide: Callable[..., Ruling], reply: Any) -> Any:
        """Carry ``arrival`` on with its decision's ``reply`` (an exception: decide it
        again the ordinary way)."""
        try:
            if isinstance(reply, BaseException):
                step = self.decide(arrival)
            else:
                step = decide(funnel=self.inflight.replay(reply, self.runtime.funnel._eval))
        except Exception as error:  # one task fails, the worker runs on
            return self.fail(arrival.request, error, False)
        return self.decided(arrival, step, None)
