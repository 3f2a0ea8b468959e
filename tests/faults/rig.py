"""The servers of one fault run: the record store, the funnels' Redis, the broker (a
private Redis, or RabbitMQ with a fresh queue) and the proxy where the case has one.

What the runner asks of them besides: whether the broker still holds a message (queued,
or delivered and not acked: it may come again) and how many tasks are parked.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import redis
from kombu.connection import Connection
from kombu.entity import Queue

from celery_funnel._limiter.keys import parked_keys
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import RedisServer
from tests.faults.aof import Fate, fates, read_commands
from tests.faults.cases import Case
from tests.faults.proj import FaultConf
from tests.faults.proxy import Proxy
from tests.faults.workers import Supervisor

__all__ = ["AMQP", "Rig"]

AMQP = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
AOF_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")
PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: a queue's priority lists
PRIORITIES = (3, 6, 9)  # besides the queue's own list (priority 0)
PREFIX = "funnel:"  # funnel_key_prefix


class Rig:
    """Everything one run of ``case`` needs but the workers; entered with
    ``servers(case, logdir)``. ``workers`` is set by the runner once they start."""

    def __init__(self, case: Case, logdir: Path) -> None:
        self.case, self.logdir = case, logdir
        self.queue = f"faults-{time.time_ns()}"
        self.store = RedisServer()
        self.funnels = RedisServer(None, None, *(AOF_ALWAYS if case.funnels_aof else ()))
        self.broker: RedisServer | None = None
        if case.broker != "amqp":
            self.broker = RedisServer(None, None, *(AOF_ALWAYS if "aof" in case.broker else ()))
        self.proxy: Proxy | None = None
        self._workers: Supervisor | None = None

    @property
    def workers(self) -> Supervisor:
        assert self._workers is not None, "the workers are not started yet"
        return self._workers

    @workers.setter
    def workers(self, supervisor: Supervisor) -> None:
        self._workers = supervisor

    def require_proxy(self) -> Proxy:
        assert self.proxy is not None, f"{self.case.name}: no proxy in this case"
        return self.proxy

    def redis(self, name: Literal["broker", "funnels"]) -> RedisServer:
        server = self.funnels if name == "funnels" else self.broker
        assert server is not None, f"{self.case.name}: no {name} Redis"
        return server

    def start(self, name: Literal["broker", "funnels"]) -> None:
        """Start a killed server again (same port, same files)."""
        self.redis(name).start()

    @property
    def broker_url(self) -> str:
        """The broker, as the producer (never behind the proxy) reaches it."""
        return self.broker.url if self.broker is not None else AMQP

    def conf(self, *, workers: bool) -> FaultConf:
        """The app's conf: the workers' reaches the proxied server through the proxy."""
        case, broker, funnels = self.case, self.broker_url, self.funnels.url
        if workers and self.proxy is not None:
            if case.proxied == "funnels":
                funnels = _via(funnels, self.proxy.port)
            else:
                broker = _via(broker, self.proxy.port)
        return FaultConf(
            broker=broker, funnels=funnels, store=self.store.url, queue=self.queue,
            rate=case.rate, capacity=case.capacity, plain_rate=case.plain_rate,
            visibility=case.visibility, acks_late=case.acks_late, prefetch=case.prefetch,
            heartbeat=2.0 if case.broker == "amqp" else None, celery_only=case.celery_only,
            transport=case.transport,
        )  # fmt: skip

    def held(self) -> int | None:
        """Messages the broker holds: queued, or delivered and not acked (None: the
        broker cannot say now)."""
        if self.broker is None:
            return _rabbitmq_held(self.queue)
        keys = [self.queue, *(f"{self.queue}{PRIORITY_SEP}{p}" for p in PRIORITIES)]
        try:
            with redis.Redis.from_url(self.broker.url, socket_timeout=1) as client:
                pipe = client.pipeline(transaction=False)
                for key in keys:
                    pipe.llen(key)
                pipe.hlen("unacked")
                return sum(int(n) for n in pipe.execute())
        except redis.RedisError:  # killed right now
            return None

    def broker_fates(self, ids: set[str]) -> dict[str, Fate]:
        """What the broker's append-only file says of each of ``ids`` (a Redis broker
        with AOF; nothing otherwise); the file is copied to the log directory."""
        if self.broker is None or "aof" not in self.case.broker:
            return {}
        commands = read_commands(self.broker.directory)
        keep = self.logdir / "broker-aof"
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(self.broker.directory, keep, ignore=shutil.ignore_patterns("*.rdb"))
        queues = {self.queue, *(f"{self.queue}{PRIORITY_SEP}{p}" for p in PRIORITIES)}
        every = fates(commands, queues)
        return {task_id: every.get(task_id, Fate()) for task_id in ids}

    def broker_state(self) -> dict[str, int | None]:
        """What a Redis broker holds: queued, un-acked, and the seconds left on kombu's
        lock that every worker takes to restore un-acked messages (-2: no lock)."""
        if self.broker is None:
            return {}
        keys = [self.queue, *(f"{self.queue}{PRIORITY_SEP}{p}" for p in PRIORITIES)]
        try:
            with redis.Redis.from_url(self.broker.url, socket_timeout=1) as client:
                return {
                    "queued": sum(int(client.llen(key)) for key in keys),
                    "unacked": int(client.hlen("unacked")),
                    "unacked_mutex_ttl": int(client.ttl("unacked_mutex")),
                }
        except redis.RedisError:
            return {"queued": None}

    def parked(self) -> int | None:
        """Tasks parked in the funnels' Redis (None: it cannot say now)."""
        try:
            with redis.Redis.from_url(self.funnels.url, socket_timeout=1) as client:
                return ParkStore(client, PREFIX).count()
        except Exception:  # the store wraps Redis's errors in its own
            return None

    def park_states(self, ids: set[str]) -> dict[str, str | None]:
        """Where the parked-task store left each of ``ids``: its ``accepted`` field (the
        token of a release no worker accepted, "+token" once one was, "parked" when
        parked again; None: never released), or "parked" while an entry waits."""
        accepted, entries = parked_keys(PREFIX).accepted, parked_keys(PREFIX).entries
        states: dict[str, str | None] = {}
        with redis.Redis.from_url(self.funnels.url, socket_timeout=5) as client:
            for task_id in sorted(ids):
                state = client.hget(accepted, task_id)
                waiting = client.hexists(entries, task_id)
                states[task_id] = "parked" if waiting else state and state.decode()
        return states

    def delete_queue(self) -> None:
        """RabbitMQ keeps a queue and its exchange: delete this run's."""
        with Connection(AMQP) as connection:
            channel = connection.channel()
            with contextlib.suppress(Exception):  # never declared: nothing to delete
                Queue(self.queue, channel=channel).delete()
            with contextlib.suppress(Exception):
                channel.exchange_delete(self.queue)


def _via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's (on 127.0.0.1)."""
    where = urlsplit(url)
    login, at, _ = where.netloc.rpartition("@")
    return where._replace(netloc=f"{login}{at}127.0.0.1:{port}").geturl()


def _rabbitmq_held(queue: str) -> int | None:
    """Ready plus unacknowledged messages of ``queue``, from rabbitmqctl (None where it is
    not here or fails)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        return None
    args = [ctl, "-q", "list_queues", "name", "messages_ready", "messages_unacknowledged"]
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        out = subprocess.run(args, capture_output=True, text=True, timeout=20, check=True)
        for line in out.stdout.splitlines():
            name, *numbers = line.split()
            if name == queue:
                return sum(int(n) for n in numbers)
        return 0
    return None


@contextlib.contextmanager
def servers(case: Case, logdir: Path) -> Iterator[Rig]:
    """The rig of ``case``, its servers started; all stopped on the way out."""
    rig = Rig(case, logdir)
    with contextlib.ExitStack() as stack:
        stack.enter_context(rig.store)
        stack.enter_context(rig.funnels)
        if rig.broker is not None:
            stack.enter_context(rig.broker)
        else:
            stack.callback(rig.delete_queue)
        if case.proxied == "funnels":
            rig.proxy = stack.enter_context(Proxy(rig.funnels.port))
        elif case.proxied == "broker":
            where = urlsplit(AMQP)
            rig.proxy = stack.enter_context(Proxy(where.port or 5672, where.hostname or ""))
        yield rig
