"""Unique tasks (``funnel_unique=True``, keyed by ``funnel_key``): while a task of a key
waits or runs, a send of the same key publishes nothing and returns the waiting task's
``AsyncResult``.

The producer takes the key before it publishes (``claim``, one script); the key holds
the task id for ``funnel_unique_ttl`` seconds, renewed every second by the worker that
runs the task (``Keeper``), and is freed when the run ends: ``task_postrun`` (success, failure, soft
time limit; not a retry, whose message keeps the key, nor an ``Ignore``), and in the
worker's main process ``task_failure`` (hard time limit, a pool process lost) and
``task_revoked`` (revoked, expired). A task whose worker died frees its key when the
claim runs out, ``funnel_unique_ttl`` after its last renewal.

Worker side (``Front``, in front of Celery's pool): a task sent past
``FunnelTask.apply_async`` (``app.send_task``, another client) takes the key as it
arrives; one that finds it held by another task is dropped: acked, its result marked
REVOKED ("duplicate of <holder>": ``AsyncResult.get`` raises ``TaskRevokedError``), a
``task-revoked`` and a ``funnel-dropped`` event, a log line, never run.
"""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from celery import signals, states
from celery.worker.state import task_ready

from .._config.dedupe import Unique
from .._config.options import unique_of
from .._config.runtime import Runtime, runtime_for
from .._limiter.keys import hash_tag
from .._shared.follow import FOLLOWS, ended, follows_of, in_canvas, unique_funnel
from .._shared.publish import gate_publishes
from .concurrency_renewal import alive
from .loop import Loop, log_failure

__all__ = ["Front", "Keeper", "claim", "connect", "free"]

logger = logging.getLogger("celery_funnel")
_UNSET = object()
PAUSE_SECONDS = 1.0  # the longest pause between two renewals


def claim(task: Any, args: Any, kwargs: Any, options: dict[str, Any]) -> Any:
    """Before a send: take the task's unique key for it (its id set in ``options``).
    None: send it, holding the key or, inside a canvas (``_shared.follow``), as a
    follower of the task that holds it (``options``' headers say which); else the
    ``AsyncResult`` of the task that holds the key (send nothing). A holder whose
    outcome is stored has ended (its key not freed yet): the key is taken over.

    Raises:
        BackendError: the funnels' Redis failed (nothing taken).
    """
    spec = unique_of(task)
    if spec is None or gate_publishes() or task.app.conf.task_always_eager:
        return None
    task_id = options.setdefault("task_id", str(uuid.uuid4()))
    runtime = runtime_for(task.app)
    funnel = unique_funnel(task, spec, args, kwargs)
    held, holder = runtime.unique.claim(funnel, task_id, spec.ttl)
    if not held and ended(task, holder):  # a producer that saw its result sends again
        held, holder = runtime.unique.claim(funnel, task_id, spec.ttl, over=holder)
    if held:
        return None
    runtime.observer.collapsed(task.name, holder, task.name, "unique")
    if in_canvas(options):  # its canvas goes on from the holder's outcome
        options["headers"] = {**(options.get("headers") or {}), FOLLOWS: holder}
        return None
    return task.AsyncResult(holder)


def free(task: Any, task_id: str | None, args: Any, kwargs: Any) -> None:
    """The run of ``task_id`` ended, or was never sent: free its key if it holds it.
    Never raises (a key not freed runs out with its claim)."""
    if task is None or task_id is None or not runtime_for(task.app).installed:
        return
    try:
        spec = unique_of(task)
        if spec is not None:
            runtime_for(task.app).unique.free(unique_funnel(task, spec, args, kwargs), task_id)
    except Exception as error:
        logger.warning("celery-funnel: task %s[%s] kept its unique key: %r", task.name, task_id,
                       error)  # fmt: skip


def _on_postrun(
    sender: Any = None, task_id: str | None = None, args: Any = None, kwargs: Any = None,
    state: str | None = None, **_: Any,
) -> None:  # fmt: skip
    if state not in (states.RETRY, states.IGNORED):  # a retry's message keeps the key
        free(sender, task_id, args, kwargs)


def _on_failure(
    sender: Any = None, task_id: str | None = None, args: Any = None, kwargs: Any = None, **_: Any
) -> None:
    free(sender, task_id, args, kwargs)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None:
        free(sender, request.id, request.args, request.kwargs)


def connect() -> None:
    """Connect the receivers that free the keys of ended runs (once per process)."""
    for signal, receiver, name in (
        (signals.task_postrun, _on_postrun, "postrun"),
        (signals.task_failure, _on_failure, "failure"),
        (signals.task_revoked, _on_revoked, "revoked"),
    ):
        signal.connect(receiver, dispatch_uid=f"celery_funnel.unique_{name}", weak=False)


class Keeper(Loop):
    """Renews the unique keys of the runs this worker passed to its pool until their
    request is done: every ``PAUSE_SECONDS`` (a second; a key's TTL is at least 3 s),
    all of them in one call (one per TTL, and per hash tag on a Redis Cluster)."""

    name = "celery-funnel-unique"

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.runtime = runtime
        # task id -> (funnel, ttl, the request, weakly)
        self._held: dict[str, tuple[str, float, Callable[[], Any]]] = {}
        self._started = False

    def track(self, funnel: str, ttl: float, request: Any) -> None:
        """Renew ``request``'s key on ``funnel`` while the worker has the request."""
        self._held[request.id] = (funnel, ttl, weakref.ref(request))
        if not self._started:
            self._started = True
            self.start()

    def tick(self) -> float:
        held = [(i, entry) for i, entry in list(self._held.items()) if alive(entry[2])]
        for task_id in set(self._held) - {i for i, _ in held}:
            self._held.pop(task_id, None)  # done: its end freed the key, or its TTL will
        # one call per TTL; on a Redis Cluster, one per hash tag too (one slot each)
        cluster = "Cluster" in type(self.runtime.unique.client).__name__
        groups: dict[tuple[str | None, float], list[tuple[str, str]]] = {}
        for task_id, (funnel, ttl, _) in held:
            tag = hash_tag(funnel) if cluster else None
            groups.setdefault((tag, ttl), []).append((funnel, task_id))
        for (_, ttl), pairs in groups.items():
            for index in self.runtime.unique.renew(pairs, ttl):
                self._held.pop(pairs[index][1], None)
        # at most a second: a run tracked meanwhile (its TTL from 3 s) is renewed in time
        return min([PAUSE_SECONDS, *(entry[1] / 3 for _, entry in held)])

    def failed(self, error: Exception) -> None:
        log_failure("renewing the keys of unique tasks (tried again)", error)


class Front:
    """In front of Celery's pool (``handle``, the consumer's ``on_task_request``): a
    unique task takes its key as it arrives; one whose key another task holds is
    dropped. ``events(request)``: the sender of its Celery events (None: off)."""

    def __init__(
        self,
        runtime: Runtime,
        app: Any,
        handle: Callable[[Any], Any],
        events: Callable[[Any], Callable[..., Any] | None],
    ) -> None:
        self.runtime, self.app, self.handle, self.events = runtime, app, handle, events
        self.keeper = Keeper(runtime)
        self._specs: dict[str, Any] = {}
        connect()

    def _spec(self, name: str) -> Unique | None:
        spec = self._specs.get(name, _UNSET)
        if spec is _UNSET:
            task = self.app.tasks.get(name)
            spec = self._specs[name] = unique_of(task) if task is not None else None
        return spec if isinstance(spec, Unique) else None

    def __call__(self, request: Any) -> Any:
        spec = self._spec(request.type)
        if spec is None or follows_of(request.request_dict):  # the gate saw to followers
            return self.handle(request)
        try:
            funnel = unique_funnel(request.task, spec, request.args, request.kwargs)
            self.runtime.outage.check()  # no call waits on a Redis known to fail
            held, holder = self.runtime.unique.claim(funnel, request.id, spec.ttl)
            if not held and ended(request.task, holder):  # ended, its end not yet seen
                held, holder = self.runtime.unique.claim(funnel, request.id, spec.ttl, over=holder)
        except Exception as error:  # never lose a task to the check: it runs
            logger.warning("celery-funnel: task %s[%s] runs without its unique check: %r",
                           request.name, request.id, error)  # fmt: skip
            return self.handle(request)
        if not held:
            return self._drop(request, funnel, holder)
        self.keeper.track(funnel, spec.ttl, request)
        return self.handle(request)

    def _drop(self, request: Any, funnel: str, holder: str) -> None:
        task_ready(request)
        # as Celery ends a revoked task: event consumers (Flower) see it REVOKED
        request.send_event("task-revoked", terminated=False, signum=None, expired=False)
        request.task.backend.mark_as_revoked(
            request.id, f"duplicate of {holder}", request=request._context,
            store_result=request.store_errors,
        )  # fmt: skip
        request.acknowledge()
        events = self.events(request)
        self.runtime.observer.dropped(request.name, request.id, funnel, holder, events)

    def close(self) -> None:
        """Stop renewing (the keys of runs not ended run out with their TTL)."""
        self.keeper.stop()
