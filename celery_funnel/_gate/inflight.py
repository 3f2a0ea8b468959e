"""Decisions in flight (``InFlightDecisions``): the worker gate sends a run's decision
without waiting, on its own connection (``inflight_connection``, read the lean way where
it can: ``inflight_lean``), and carries the run on when the reply comes, through the
same phases as a decision waited for. While the reply travels, the message is kept out
of the consumer's prefetch window (``window``, bounded), so that the next one is
fetched meanwhile.

A reply that admits (the script's ``admits``, its ``admitted`` in Python) is the one
ruling every admitted run gets: it is reported as ``judge`` reports it and the run goes
on, without replaying the decision on the reply (a sixth of the gate's calls per
task); any other reply is decoded by the decision replayed.

A simple run on a fast funnel asks for an allowance in its call (``allowance``): the
units its reply takes beyond its own are held, and the next runs of that funnel are
admitted on them (``spend``) without a call, as a reply that admits is reported."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any

from redis.exceptions import RedisError

from .._config.runtime import Runtime
from .._limiter.scripts import Admits, Call
from .._shared.charges import Charge
from .._shared.judge import RUN, Ruling, Subject, judge
from .._shared.live import Live
from .._shared.state import State
from .._stores.concurrency import Lease
from .allowance import Allowances, Keep
from .arrival import Arrival
from .inflight_connection import InFlight
from .window import Window

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
    the ordinary way, ``decided`` acts on a decision, ``fail`` fails a request;
    ``window``: the consumer's prefetch window (None: left alone); ``allowances``: the
    units this worker holds (None: none taken)."""

    def __init__(
        self, runtime: Runtime, live: Live, inflight: InFlight,
        decide: Decide, decided: Decided, fail: Fail, window: Window | None = None,
        allowances: Allowances | None = None,
    ) -> None:  # fmt: skip
        self.runtime, self.live, self.inflight = runtime, live, inflight
        self.decide, self.decided, self.fail = decide, decided, fail
        self.window, self.allowances = window, allowances
        # the call per charges, state and subject, task id aside
        self.calls: dict[Hashable, Call | None] = {}

    def spend(self, arrival: Arrival) -> Ruling | None:
        """``arrival``'s run paid by a unit this worker holds (``Allowances``): the
        ruling that admits it, reported as ``judge`` reports it; None: decide it."""
        if self.allowances is None or not self.allowances.spend(arrival):
            return None
        return self._admitted(arrival.subject, arrival.label)

    def send(self, arrival: Arrival) -> bool:
        """Send ``arrival``'s decision without waiting for it, when it is one script
        call: not for fair-share funnels (their decision is not one call) nor paused ones
        (decided here, no call). Only a first arrival's, and only while no task was
        deferred lately (``inflight_connection.CALM_SECONDS``): a task that waits comes back to
        redeem its slot at its time, decided as before."""
        charges, state = arrival.charges, arrival.state
        if state.deferrals or not self.inflight.on or any(c.fair for c in charges):
            return False
        if self.runtime.outage.down:  # decided the ordinary way: the outage policy
            return False
        if self.live.overrides.paused(charges) is not None:
            return False
        subject, charges = arrival.subject, self.live.apply(charges)
        decide = partial(judge, self.runtime, subject, charges, state)
        call = self.call(subject, charges, state)
        if call is None:  # decided without Redis: decide again the ordinary way
            return False
        keep = None
        if self.allowances is not None:  # one funnel's units at once, where they may be
            call, keep = self.allowances.wanted(arrival, charges, call)
        left = self.window is not None and self.window.leave()
        resume = partial(self._resume, arrival, decide, call[0].admits, left, keep=keep)
        try:
            self.inflight.send(call, resume)
        except (RedisError, OSError):  # the ordinary way, with the outage policy
            self._enter(left)
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
            stand_in = subject._replace(task_id=STAND_IN)
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

    def _enter(self, left: bool) -> None:
        if self.window is not None:
            self.window.enter(left)

    def _resume(
        self, arrival: Arrival, decide: Callable[..., Ruling], admits: Admits | None,
        left: bool, reply: Any, *, keep: Keep | None = None,
    ) -> Any:  # fmt: skip
        """Carry ``arrival`` on with its decision's ``reply`` (an exception: decide it
        again the ordinary way); its message is back in the prefetch window first
        (``left``: it was kept out); ``keep``: told the reply of a call that asked for
        an allowance (it holds the units taken beyond the run's own)."""
        self._enter(left)
        try:
            if keep is not None:
                keep(reply)
            if isinstance(reply, BaseException):
                ruling = self.decide(arrival)
            elif admits is not None and admits(reply if isinstance(reply, list) else [reply]):
                ruling = self._admitted(arrival.subject, arrival.label)
            else:
                ruling = decide(funnel=self.inflight.replay(reply, self.runtime.funnel._eval))
        except Exception as error:  # one task fails, the worker runs on
            return self.fail(arrival.request, error, False)
        return self.decided(arrival, ruling, None)

    def _admitted(self, subject: Subject, label: str) -> Ruling:
        """What ``judge`` answers and reports for a reply that admits: Redis answered,
        the run goes on."""
        self.runtime.outage.answered()
        self.runtime.observer.admitted(
            subject.name, subject.task_id, label, dry_run=subject.dry_run
        )
        return RUN
