"""The rounds of ``bench/transport.py``, each on private redis-servers with real
``celery worker`` processes of ``bench/_transport_app.py``: a saturated drain, publish
to start at idle, and idle workers.

A broker's cost is read from the server itself (``INFO all``): its CPU seconds
(``used_cpu_sys`` + ``used_cpu_user``), its commands (``total_commands_processed``) and
its ``commandstats``, of which the *fetch* is the server time a transport spends
taking and recording messages: kombu's BRPOP and its record's HSET and ZADD, or ours
EVAL/EVALSHA (the record's writes inside) and the markers' BRPOP.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from bench._transport_app import NOOP, START, make_app
from celery_funnel.testing import CeleryWorkers, RedisServer

ROOT = Path(__file__).resolve().parent.parent
FETCH = {False: ("brpop", "hset", "zadd"), True: ("eval", "evalsha", "brpop")}
POLLS = {False: ("brpop",), True: ("eval", "evalsha", "brpop")}  # a consumer's requests
DEADLINE = 600.0  # seconds: only detects a hang


@dataclass(frozen=True)
class Reading:
    """What a broker has done since it started: CPU seconds, commands (a script's own
    calls included), the server microseconds of its fetch's commands, and its
    consumers' polls (BRPOP, and ours' fetches; kombu's rare binding scripts too)."""

    cpu: float
    commands: int
    fetch_usec: float
    polls: int

    def __sub__(self, other: Reading) -> Reading:
        return Reading(
            self.cpu - other.cpu,
            self.commands - other.commands,
            self.fetch_usec - other.fetch_usec,
            self.polls - other.polls,
        )


def read(client: redis.Redis, ours: bool) -> Reading:
    """``client``'s server, now (one INFO, counted among the commands)."""
    info = client.info("all")

    def stat(name: str, field: str) -> float:
        return float(info.get(f"cmdstat_{name}", {}).get(field, 0))

    return Reading(
        float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        int(info["total_commands_processed"]),
        sum(stat(name, "usec") for name in FETCH[ours]),
        int(sum(stat(name, "calls") for name in POLLS[ours])),
    )


def workers(url: str, ours: bool, count: int, *options: str) -> CeleryWorkers:
    """``count`` workers of the bench app on ``url`` (``ours``: our transport)."""
    env = {"FUNNEL_BENCH_URL": url, "FUNNEL_BENCH_OURS": "1" if ours else "0"}
    return CeleryWorkers("bench._transport_app", count, env, *options, cwd=str(ROOT), prefix="t")


def wait_for(client: redis.Redis, key: str, length: int, every: float = 0.002) -> None:
    """Until list ``key`` holds ``length`` items, asking ``every`` seconds (a deadline
    only detects a hang)."""
    deadline = time.monotonic() + DEADLINE
    while client.llen(key) < length:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{key}: {client.llen(key)} of {length} after {DEADLINE} s")
        time.sleep(every)


def fill(url: str, ours: bool, queue: str, count: int, body: int, stamp: str) -> None:
    """``count`` no-op tasks of ``body`` bytes each in ``queue`` (the first and the
    last stamp), published by a producer on the same transport as the worker."""
    app = make_app(url, ours)
    weight = "x" * body
    with app.producer_or_acquire() as producer:
        for number in range(count):
            first_or_last = number in (0, count - 1)
            app.send_task(
                NOOP, kwargs={"stamp": stamp if first_or_last else "", "body": weight},
                queue=queue, producer=producer,
            )  # fmt: skip
    app.close()


def saturated(ours: bool, pool: str, count: int, body: int) -> dict[str, float]:
    """One worker (``pool``, -c 4), started and idle on a fresh server, told to consume
    a queue of ``count`` tasks filled meanwhile: tasks/s between the first and the last
    start; from the order to the last start, per message, the broker's CPU and fetch
    and the worker's CPU (every process of it: startup is left out)."""
    with RedisServer() as server, redis.Redis.from_url(server.url) as client:
        stamp = f"stamp-{uuid.uuid4().hex[:8]}"
        app = make_app(server.url, ours)
        with workers(server.url, ours, 1, "-P", pool, "-c", "4", "-Q", "idle") as group:
            fill(server.url, ours, "drained", count, body, stamp)
            before, cpu = read(client, ours), tree_cpu(p.pid for p in group.processes)
            app.control.add_consumer("drained", reply=False)
            app.control.cancel_consumer("idle", reply=False)  # after: never no queue
            wait_for(client, stamp, 2, 0.05)  # rarely: the broker's CPU is measured
            spent = read(client, ours) - before
            worker = tree_cpu(p.pid for p in group.processes) - cpu
        first, last = (float(v) for v in client.lrange(stamp, 0, 1))
        app.close()
    return {
        "rate": (count - 1) / (last - first),
        "cpu_us": spent.cpu / count * 1e6,
        "fetch_us": spent.fetch_usec / count,
        "worker_us": worker / count * 1e6,
    }


LATENCY_ROWS = {  # row: (the producer's transport is ours, the worker's is ours)
    "stock": (False, False),
    "ours": (True, True),
    "fallback": (False, True),
}


@contextlib.contextmanager
def idle_workers(
    rows: dict[str, bool], count: int, *options: str
) -> Iterator[dict[str, tuple[RedisServer, CeleryWorkers]]]:
    """Per row (its transport is ours or not): a fresh server and ``count`` ready
    workers on it, all started together; stopped together."""
    with contextlib.ExitStack() as stack:
        started: dict[str, tuple[RedisServer, CeleryWorkers]] = {}
        for row, ours in rows.items():
            server = stack.enter_context(RedisServer())
            group = workers(server.url, ours, count, *options)
            stack.callback(group.stop)
            started[row] = (server, group.start())
        for _server, group in started.values():
            group.wait_ready(timeout=DEADLINE)
        yield started


def latency(samples: int, fallback_every: int) -> dict[str, list[float]]:
    """Publish to start, seconds: one idle worker (prefork -c 1) per row of
    ``LATENCY_ROWS``, each on its own server, all up at once; tasks are sent one at a
    time, to each row in turn, each after a pause, and the next only once it started.
    The fallback row (a stock producer: no marker) is sent every ``fallback_every``-th
    turn, after a further pause drawn over the worker's 1 s poll."""
    rows = {row: worker for row, (_producer, worker) in LATENCY_ROWS.items()}
    got: dict[str, list[float]] = {row: [] for row in rows}
    with idle_workers(rows, 1, "-P", "prefork", "-c", "1") as started:
        apps = {
            row: make_app(server.url, LATENCY_ROWS[row][0]) for row, (server, _) in started.items()
        }
        clients = {row: redis.Redis.from_url(server.url) for row, (server, _) in started.items()}
        chooser = random.Random(54)
        for turn in range(samples):
            for row in rows:
                if row == "fallback" and turn % fallback_every:
                    continue
                extra = chooser.uniform(0.0, 1.0) if row == "fallback" else 0.0
                time.sleep(chooser.uniform(0.02, 0.1) + extra)  # the worker is idle again
                key = f"latency-{row}"
                apps[row].send_task(START, args=(key, time.time()))
                wait_for(clients[row], key, len(got[row]) + 1)
                got[row].append(float(clients[row].lindex(key, -1) or 0))
        for app in apps.values():
            app.close()
        for client in clients.values():
            client.close()
    return got


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from /proc (0: gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pids: Iterable[int]) -> float:
    """CPU seconds used by processes ``pids`` and every live process under them."""
    total = 0.0
    for pid in pids:
        children: list[int] = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                children += [int(c) for c in (task / "children").read_text().split()]
        total += cpu_of(pid) + tree_cpu(children)
    return total


def idle(count: int, window: float, windows: int) -> dict[str, list[dict[str, float]]]:
    """``count`` idle workers (-P solo) on each transport's own server, and a server
    with none, all at once: per window of ``window`` seconds, each broker's CPU
    milliseconds, commands and polls per second, and its workers' CPU ms per second."""
    rows = {"stock": False, "ours": True}
    got: dict[str, list[dict[str, float]]] = {row: [] for row in (*rows, "none")}
    with idle_workers(rows, count, "-P", "solo") as started, RedisServer() as bare:
        watched = {
            row: Watched(server.url, row == "ours", group)
            for row, (server, group) in started.items()
        }
        watched["none"] = Watched(bare.url, False, None)
        time.sleep(2.0)  # past the workers' first polls and script loads
        for _ in range(windows):
            for each in watched.values():
                each.start()
            time.sleep(window)
            for row, each in watched.items():
                got[row].append(each.per_second())
        for each in watched.values():
            each.client.close()
    return got


class Watched:
    """A broker and its workers (``group``; None: none), read at a window's start
    (``start``) and end (``per_second``)."""

    def __init__(self, url: str, ours: bool, group: CeleryWorkers | None) -> None:
        self.client, self.ours, self.group = redis.Redis.from_url(url), ours, group
        self.at, self.broker, self.workers = 0.0, Reading(0.0, 0, 0.0, 0), 0.0

    def _workers_cpu(self) -> float:
        return tree_cpu(p.pid for p in self.group.processes) if self.group else 0.0

    def start(self) -> None:
        self.at = time.monotonic()
        self.broker, self.workers = read(self.client, self.ours), self._workers_cpu()

    def per_second(self) -> dict[str, float]:
        """Since ``start``: the broker's CPU ms, commands, polls; the workers' CPU ms."""
        spent = read(self.client, self.ours) - self.broker
        workers = self._workers_cpu() - self.workers
        seconds = time.monotonic() - self.at
        return {
            "cpu_ms": spent.cpu / seconds * 1e3,
            "commands": spent.commands / seconds,
            "polls": spent.polls / seconds,
            "workers_ms": workers / seconds * 1e3,
        }
