"""Plain fakes to drive the worker gate (``_gate.gate.WorkerGate``) without a Redis server
or a Celery worker: a request as Celery's consumer hands it over (id, name, args,
headers, delivery info, a message to ack or reject), a consumer with a timer the test
fires, the pool (what the gate passes a run on to), a publisher recording what it would
publish, and a ``MemoryFunnel`` (the Python twins of the Lua scripts: a real funnel, in
memory) on a clock the test moves, in the app's ``Runtime``.

``Fakes`` holds them all; ``Fakes.gate()`` composes a gate over them as
``_celery.services.gate`` does over a worker's consumer. Time moves only when a test
says so (``Fakes.advance``): the funnels' clock, and the deliveries' receipts (a
delivery's times are counted in ``time.monotonic()`` seconds).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from celery import Celery
from celery.worker import state as worker_state

from celery_funnel._config.outage import OutageLog
from celery_funnel._config.runtime import Runtime
from celery_funnel._gate.gate import WorkerGate
from celery_funnel._limiter.backends.memory import MemoryFunnel
from celery_funnel._limiter.errors import BackendError
from celery_funnel._limiter.scripts import Arg, Reply, Script
from celery_funnel._shared.charges import OwnCharges
from celery_funnel._shared.delivery import Delivery, delivery_of
from celery_funnel._shared.state import HEADER

T0 = 1_700_000_000.0
_ids = itertools.count(1)


class Clock:
    """The funnels' clock: seconds since the epoch, moved by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Funnel(MemoryFunnel):
    """A ``MemoryFunnel`` whose Redis can go ``down``: every script call then fails as
    ``RedisFunnel`` fails it (``BackendError``), and nothing is decided."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.down = False

    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        if self.down:
            raise BackendError("the funnels' Redis does not answer (a fake outage)")
        return super()._eval(script, keys, args)


class Backend:
    """A task's result backend: what it stores, or ``broken`` (it raises)."""

    def __init__(self) -> None:
        self.failed: dict[str, BaseException] = {}
        self.revoked: dict[str, str] = {}
        self.broken = False

    def mark_as_failure(self, task_id: str, exc: BaseException, *args: Any, **kw: Any) -> None:
        if self.broken:
            raise ConnectionError("the result backend is gone")
        self.failed[task_id] = exc

    def mark_as_revoked(self, task_id: str, reason: str = "", *args: Any, **kw: Any) -> None:
        self.revoked[task_id] = reason


@dataclass(eq=False)  # hashable: signals are sent with the task as their sender
class Task:
    """A registered task, as a request names it."""

    name: str
    app: Any
    backend: Backend
    ignore_result: bool = False


class Message:
    """A broker message: acked, or rejected (requeued or not); ``journal`` records both
    in order, with what else happened (the publisher's publishes)."""

    def __init__(self, task_id: str, journal: list[tuple[str, str]], received: float | None):
        self.task_id, self.journal = task_id, journal
        self.acked = False
        self.requeued: bool | None = None  # rejected: requeued (True) or not
        if received is not None:
            self.celery_funnel_received = received  # _shared.delivery.RECEIVED_AT

    def ack(self) -> None:
        self.acked = True
        self.journal.append(("ack", self.task_id))

    def reject(self, requeue: bool = False) -> None:
        self.requeued = requeue
        self.journal.append(("hand back" if requeue else "reject", self.task_id))


class Request:
    """A task request as Celery's consumer hands it to ``on_task_request``: it ends as
    Celery's ``Request`` ends (``acknowledge``, ``reject``, ``revoked``, events)."""

    def __init__(
        self,
        task: Task,
        journal: list[tuple[str, str]],
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        headers: Mapping[str, Any] | None = None,
        received: float | None = None,
    ) -> None:
        self.id = f"task-{next(_ids)}-{uuid.uuid4().hex[:6]}"
        self.task = task
        self.name = self.type = task.name
        self.args, self.kwargs = tuple(args), dict(kwargs or {})
        self.request_dict: dict[str, Any] = {"id": self.id, **(headers or {})}
        self.delivery_info: dict[str, Any] = {"priority": None, "redelivered": False}
        self.message = Message(self.id, journal, received)
        self.expires = None
        self.store_errors = True
        self.content_type, self.content_encoding = "application/json", "utf-8"
        self._context = SimpleNamespace(
            id=self.id, task=self.name, parent_id=None, headers=dict(headers or {})
        )
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.acknowledged = False

    @property
    def header(self) -> dict[str, Any]:
        """The ``celery_funnel`` header as the gate left it."""
        found: dict[str, Any] = self.request_dict.get(HEADER) or {}
        return found

    def acknowledge(self) -> None:
        self.acknowledged = True
        self.message.ack()

    def reject(self, requeue: bool = False) -> None:
        self.message.reject(requeue=requeue)

    def send_event(self, type_: str, **fields: Any) -> None:
        self.events.append((type_, fields))

    def revoked(self) -> bool:
        """Whether it was revoked; ended then as Celery ends it (REVOKED stored, the
        ``task-revoked`` event, the message acked)."""
        if self.id not in worker_state.revoked:
            return False
        worker_state.task_ready(self)
        self.send_event("task-revoked", terminated=False, signum=None, expired=False)
        self.task.backend.mark_as_revoked(self.id, "revoked")
        self.acknowledge()
        return True


@dataclass
class Entry:
    """One entry on the consumer's timer."""

    secs: float
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    repeat: bool = False


class Timer:
    """The consumer's timer: entries wait until the test fires them (``fire``)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def call_after(
        self, secs: float, fn: Callable[..., Any], args: Iterable[Any] = (), priority: int = 0
    ) -> Entry:
        entry = Entry(secs, fn, tuple(args))
        self.entries.append(entry)
        return entry

    def call_repeatedly(
        self, secs: float, fn: Callable[..., Any], args: Iterable[Any] = (), priority: int = 0
    ) -> Entry:
        entry = Entry(secs, fn, tuple(args), repeat=True)
        self.entries.append(entry)
        return entry

    def cancel(self, entry: Entry) -> None:
        if entry in self.entries:
            self.entries.remove(entry)

    @property
    def waiting(self) -> list[Entry]:
        """The one-shot entries (held requests), in the order they were added."""
        return [entry for entry in self.entries if not entry.repeat]

    def fire(self) -> int:
        """Run every one-shot entry now (their time has come); how many ran."""
        due = self.waiting
        for entry in due:
            self.entries.remove(entry)
        for entry in due:
            entry.fn(*entry.args)
        return len(due)

    def tick(self) -> None:
        """Run every repeating entry once (the held requests' sweep)."""
        for entry in [entry for entry in self.entries if entry.repeat]:
            entry.fn(*entry.args)


class QoS:
    """The consumer's prefetch count: a held request leaves it while it waits."""

    def __init__(self) -> None:
        self.held = 0

    def increment_eventually(self) -> None:
        self.held += 1

    def decrement_eventually(self) -> None:
        self.held -= 1


@dataclass
class Published:
    """What the publisher would publish: a run again, ``countdown`` seconds from now,
    with ``state`` as its ``celery_funnel`` header."""

    task_id: str
    countdown: float
    state: dict[str, Any]


class Publisher:
    """Publishes a refused run again (``_shared.publish.republish``'s signature), into a
    list; ``broken``: the broker refuses it (raises)."""

    def __init__(self, journal: list[tuple[str, str]]) -> None:
        self.journal = journal
        self.published: list[Published] = []
        self.broken = False

    def __call__(
        self,
        task: Any,
        context: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        countdown: float,
        state: Mapping[str, Any],
        content_type: str | None = None,
        content_encoding: str | None = None,
    ) -> None:
        if self.broken:
            raise ConnectionError("the broker refused the publish")
        self.published.append(Published(context.id, countdown, dict(state)))
        self.journal.append(("publish", context.id))


def no_own_charges(task: Any) -> OwnCharges | None:
    """No task has own options (no FunnelTask): only ``funnel_limits`` apply."""
    return None


@dataclass
class Fakes:
    """An app whose ``funnel_limits`` are ``limits``, its runtime on a ``Funnel`` (a
    ``MemoryFunnel``) and a consumer of fakes; ``conf``: more settings."""

    limits: Mapping[str, Any] = field(default_factory=dict)
    conf: Mapping[str, Any] = field(default_factory=dict)
    journal: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.app = Celery("gate-fakes", set_as_current=False, broker="memory://")
        self.app.conf.update(funnel_limits=dict(self.limits), **self.conf)
        self.clock = Clock()
        self.funnel = Funnel(self.clock)
        self.runtime = Runtime(self.app)
        self.runtime.funnel = self.funnel  # type: ignore[assignment]
        # no probe: each call finds out for itself whether the funnels' Redis answers
        self.runtime.outage = OutageLog(self.app)
        self.backend = Backend()
        self.timer = Timer()
        self.consumer = SimpleNamespace(
            app=self.app, hostname="fake@host", timer=self.timer, qos=QoS(), hub=None,
            event_dispatcher=None,
        )  # fmt: skip
        self.ran: list[Request] = []  # what reached the pool, in order
        self.publisher = Publisher(self.journal)
        self.requests: list[Request] = []

    def pool(self, request: Request) -> None:
        """The consumer's own ``on_task_request``: the run goes to the pool."""
        self.ran.append(request)
        self.journal.append(("run", request.id))

    def gate(self, own_charges: Callable[[Any], OwnCharges | None] = no_own_charges) -> WorkerGate:
        """The worker gate over the fakes (as ``_celery.services.gate`` composes it)."""
        return WorkerGate(
            self.runtime, self.consumer, self.pool, lambda task: False,
            own_charges=own_charges, renewal=_no_renewal, publish=self.publisher,
        )  # fmt: skip

    def request(self, name: str = "fakes.send", **options: Any) -> Request:
        """A request of task ``name`` (``options``: ``Request``'s), just received."""
        task = Task(name, self.app, self.backend)
        request = Request(task, self.journal, **options)
        self.requests.append(request)
        return request

    def delivery(self, request: Request) -> Delivery:
        return delivery_of(request, self.runtime.countdowns)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: on the funnels' clock, and for every delivery seen."""
        self.clock.now += seconds
        for request in self.requests:
            found: Delivery | None = getattr(request, "_celery_funnel_delivery", None)
            if found is not None:
                found.received -= seconds
                found.hold_until -= seconds
                found.deadline -= seconds
                found.hands_off -= seconds

    def __enter__(self) -> Fakes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Forget the requests in Celery's worker state (a module-wide registry)."""
        for request in self.requests:
            worker_state.task_ready(request)
            worker_state.revoked.discard(request.id)


def _no_renewal(app: Any, node: str) -> Any:
    raise AssertionError("no seat is taken here: no renewal service")
