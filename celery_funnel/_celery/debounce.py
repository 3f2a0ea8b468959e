"""Debounced tasks (``funnel_debounce=seconds``, keyed by ``funnel_key``): a send
publishes nothing; it stores its message (``_stores.debounce``) as the one run of its
key's window, which the workers' releasers publish once no send of that key came for
``seconds`` (at most ``funnel_debounce_max`` after the window's first send). Every send
of one window gets the ``AsyncResult`` of the same task id, the id of the run, which
runs with the last send's arguments and options.

The window's id must be in the message before it is stored: a sender guesses it (the
last id it used for that key, else a new one: the caller's ``task_id`` when given), and
the store refuses a wrong guess with the open window's id, which the sender captures
again with, or with none (that window ran): the send then opens a window, under the
caller's ``task_id`` when it gave one.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .._config.options import debounce_of, task_name
from .._config.runtime import runtime_for
from .._limiter.errors import BackendError, ConfigurationError
from .._limiter.keys import debounce_key
from .._limiter.limit import key_part
from .._shared.publish import gate_publishes, gate_publishing
from .._stores.park import capture
from .._stores.persistence import Rule
from .releaser import LEAD_SECONDS

__all__ = ["KEEP_SECONDS", "check_store", "label_of", "send"]

KEEP_SECONDS = 3600.0  # a window outlives its release this long (a releaser down that long)
_TRIES = 5  # a window opened or released between a guess and its store, this many times
_GUESSES = 4096  # windows whose id a sender remembers


class _Guesses:
    """The last window id this process used per window key (bounded)."""

    def __init__(self) -> None:
        self._ids: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, window: str) -> str | None:
        with self._lock:
            return self._ids.get(window)

    def put(self, window: str, task_id: str) -> None:
        with self._lock:
            self._ids[window] = task_id
            self._ids.move_to_end(window)
            while len(self._ids) > _GUESSES:
                self._ids.popitem(last=False)


_GUESSED = _Guesses()


def label_of(name: str) -> str:
    """The label debounced runs of task ``name`` are counted under while they wait."""
    return f"debounce:{name}"


def check_store(runtime: Any, task: Any, spec: Any, *, rule: Rule | None) -> None:
    """Whether debounced sends of ``task`` (``spec``: its ``funnel_debounce``) can wait in
    the funnels' Redis: released (``funnel_park`` on) and kept as safely as the broker
    keeps a queued task (``rule``, ``_stores.persistence``: an append-only file, or the
    broker's own Redis server; None: not known now, allowed).

    Raises:
        ConfigurationError: naming the task, its ``funnel_debounce`` and the reason.
    """
    where = f"task {task_name(task)!r}: funnel_debounce={spec.seconds:g}"
    if not runtime.settings.park:
        raise ConfigurationError(
            f"{where} needs funnel_park (the workers' releasers publish debounced runs);"
            f" funnel_park=False"
        )
    if rule is Rule.NONE:
        raise ConfigurationError(
            f"{where} keeps each key's last send in the funnels' Redis, which has no"
            f" append-only file and is not the broker's Redis server (a restart would lose"
            f" them): turn on 'appendonly yes', or keep the funnels on the broker's Redis"
        )


def send(task: Any, args: Any, kwargs: Any, options: dict[str, Any]) -> Any:
    """Send a debounced task (``funnel_debounce``): the ``AsyncResult`` of its window's
    run; None when the task is not debounced here (not debounced, eager, or a gate's
    own publish), to be sent as usual.

    Raises:
        BackendError: the funnels' Redis failed (nothing was stored).
        ConfigurationError: the funnels' Redis cannot keep it (no AOF and not the
            broker's server, or parking off),
            as the worker says at start.
    """
    spec = debounce_of(task)
    if spec is None or gate_publishes() or task.app.conf.task_always_eager:
        return None
    runtime = runtime_for(task.app)
    check_store(runtime, task, spec, rule=runtime.persistence.rule())
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    part = key_part(spec.key, task.run, args, kwargs)
    window = debounce_key(runtime.settings.key_prefix, task.name, part)
    meta = {
        "task": task.name, "funnel": label_of(task.name), "priority": options.get("priority"),
        "parked_at": time.time(),
    }  # fmt: skip
    options = {k: v for k, v in options.items() if k not in ("producer", "connection")}
    caller = options.get("task_id")  # used when this send opens a window
    guess = _GUESSED.get(window)
    for _ in range(_TRIES):
        new = guess is None
        task_id = str(caller or uuid.uuid4()) if new else str(guess)
        message = _capture(task, args, kwargs, {**options, "task_id": task_id}, meta)
        sent = runtime.debounce.send(
            window, task_id, message, new=new, wait=spec.seconds, most=spec.most,
            lead=LEAD_SECONDS, keep=KEEP_SECONDS,
        )  # fmt: skip
        if sent.stored:
            _GUESSED.put(window, sent.task_id)
            if not sent.opened:
                runtime.observer.collapsed(task.name, sent.task_id, task.name, "debounce")
            return task.AsyncResult(sent.task_id)
        # the window guessed ran ("": open a new one), or another is open: join it
        guess = sent.task_id or None
    raise BackendError(
        f"task {task_name(task)!r}: its debounce window {window} changed {_TRIES} times"
        f" during one send; nothing was stored"
    )


def _capture(
    task: Any, args: Sequence[Any], kwargs: dict[str, Any], options: dict[str, Any], meta: Any
) -> dict[str, Any]:
    """The message Celery would publish for this send (not published)."""
    signature = task.signature(args, kwargs, **options)
    with gate_publishing():  # FunnelTask.apply_async sends it on as it is
        return capture(signature, meta)
