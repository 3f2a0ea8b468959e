#!/usr/bin/env python3
"""Every benchmark in one run: writes BENCHMARKS.md and its plots (bench/plots/*.png).

    python3 dev.py bench              # sets up .venv with the bench extra, then this
    python bench/run.py [--quick]     # --quick: short runs, to check the harness
    python3 dev.py bench transport    # some sections alone (names: --help), spliced
                                      # into BENCHMARKS.md; the others stay as they are

Sections: per decision (celery-funnel's limiters, limits and pyrate-limiter on the same
Redis and connection; the same awaited: AsyncRedisFunnel and limits.aio), the gate's cost per task in one worker, Celery overhead (prefork
and threads), shared-limit correctness on
real workers, distributed accuracy over a minute (2 and 4 workers; reservation on, off,
and Celery's rate_limit), Redis memory per funnel at 100 000 funnels, and the broker
transport against kombu's. Each part starts its own private redis-server; nothing needs
to be running.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from functools import partial

from bench import accuracy, core, core_async, instructions, memory, prefetch, transport
from bench import celery as celery_bench
from bench import worker as worker_bench
from bench._prose import (
    ACCURACY,
    CELERY,
    CORE,
    CORE_ASYNC,
    INSTRUCTIONS,
    MEMORY,
    PREFETCH,
    TRANSPORT,
    WORKER,
)
from bench._table import spread
from bench._write import Headline, splice, write, write_readme
from celery_funnel.testing import RedisServer

PLOTS = HERE / "plots"
PARTS = {  # the name of a section to run alone: its title in BENCHMARKS.md
    "core": "Per decision", "core_async": "Per decision, asyncio",
    "worker": "The gate's cost per task in one worker",
    "instructions": "Instructions: per task and per decision",
    "prefetch": "FunnelTask against plain: prefetch 1 and 4",
    "celery": "Celery: correctness and overhead", "accuracy": "Distributed accuracy",
    "memory": "Memory", "transport": "The broker transport",
}  # fmt: skip


def unpin() -> None:
    """Undo core.pin for this process: the workers started later inherit it."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


Rows = dict[str, dict[str, float]]


def _ratios(rows: dict[str, dict[str, float]], prefix: str, field: str, unit: str = "") -> str:
    got = [r[field] for name, r in rows.items() if name.startswith(prefix)]
    if not got:
        return "not installed"
    figures = f"{got[0]:.2f}" if len(got) == 1 else f"{min(got):.2f}-{max(got):.2f}"
    return figures + unit


def pinned(run: Callable[[str], Rows]) -> tuple[Rows, str]:
    """``run(url)`` on a private redis-server pinned to one core, this process to the
    other; its rows and the server's version."""
    with RedisServer(None, None, *core.server_options()) as server:
        if server.process is not None:
            core.pin(server.process.pid)
        try:
            return run(server.url), server.version
        finally:
            unpin()


def section_core(calls: int, rounds: int) -> tuple[str, Headline]:
    rows, version = pinned(partial(core.run, calls=calls, rounds=rounds))
    core.plot(rows, PLOTS / "per_decision.png")
    floor = rows[core.FLOOR]["server"]
    ours = [n for n in rows if n.startswith(core.OURS)]
    headline = [
        ("GCRA decision, client p50 / PING p50 (same connection)",
         f"{rows['gcra throttle (admitted)']['ratio']:.3f}",
         f"at most 1.15; limits {_ratios(rows, 'limits', 'ratio')},"
         f" pyrate-limiter {_ratios(rows, 'pyrate', 'ratio')}"),
        ("server µs per decision, and / TIME+GET+SET floor script"
         f" ({floor:.2f} µs)",
         "; ".join(f"{n} {rows[n]['server']:.2f} ({rows[n]['server'] / floor:.2f}x)" for n in ours),
         f"GCRA at most 1.2x the floor; limits {_ratios(rows, 'limits', 'server', ' µs')},"
         f" pyrate-limiter {_ratios(rows, 'pyrate', 'server', ' µs')},"
         f" redis-cell (native) {_ratios(rows, 'redis-cell', 'server', ' µs')}"),
        ("round trips (EVALSHA) per decision, every row",
         f"{max(rows[n]['scripts'] for n in ours):.2f}", "1"),
    ]  # fmt: skip
    body = (
        core.table(rows, version, calls, rounds)
        + "\n\n![per decision](bench/plots/per_decision.png)"
    )
    return body, headline


def section_core_async(calls: int, rounds: int) -> tuple[str, Headline]:
    rows, version = pinned(lambda url: asyncio.run(core_async.run(url, calls, rounds)))
    headline = [
        ("asyncio GCRA decision (AsyncRedisFunnel), client p50 / PING p50",
         f"{rows['async gcra throttle (admitted)']['ratio']:.3f}",
         f"limits.aio {_ratios(rows, 'limits.aio', 'ratio')}"),
    ]  # fmt: skip
    return core.table(rows, version, calls, rounds, "asyncio, "), headline


def section_worker(tasks: int, rounds: int) -> tuple[str, Headline]:
    unpin()
    with RedisServer() as server:
        results = worker_bench.run(server.url, tasks, rounds, ["prefork", "threads"])
        version = server.version
    headline = [
        (f"time per task in one worker / plain Celery's, {row}",
         ", ".join(f"{pool} {spread(results[f'{pool}: {row}'])}" for pool in ("prefork", "threads")),
         "at most 1.15")
        for row in ("FunnelTask, never limited", "funnel_limits, never limited")
    ]  # fmt: skip
    return worker_bench.table(results, tasks, rounds, version), headline


def section_instructions(tasks: int, calls: int) -> tuple[str, Headline]:
    if not instructions.valgrind():
        return "Not run: valgrind is not installed (Debian: apt-get install valgrind).", []
    got = instructions.main(["--tasks", str(tasks), "--calls", str(calls)])
    scripts, workers = got["scripts"], got["workers"]
    floor = scripts[core.FLOOR]
    headline = [
        ("instructions per task in one worker / plain Celery's (callgrind), " + row,
         ", ".join(f"{pool} {workers[f'{pool}: {row}']['ratio']:.3f}"
                   for pool in ("prefork", "threads")),
         "at most 1.15")
        for row in ("FunnelTask, never limited", "funnel_limits, never limited")
    ] + [
        ("instructions inside EVALSHA, GCRA / TIME+GET+SET floor script (callgrind)",
         f"{scripts['gcra throttle (admitted)'] / floor:.2f}",
         "at most 1.2; the floor with numbers read and written:"
         f" {scripts[core.FLOOR_SCRIPTS_WRITTEN] / floor:.2f}"),
    ]  # fmt: skip
    body = (
        instructions.script_table(scripts, got["version"], calls)
        + "\n\n"
        + instructions.worker_table(workers, tasks)
    )
    return body, headline


def section_prefetch(tasks: int, rounds: int, counted: int) -> tuple[str, Headline]:
    unpin()
    with RedisServer() as server:
        results = prefetch.run(server.url, ["prefork", "threads"], [1, 4], tasks, rounds, counted)
        body = prefetch.table(results, tasks, rounds, counted, server.version)
    prefetch.plot(results, PLOTS / "prefetch.png")
    headline = [
        ("never-limited FunnelTask / plain task throughput, one worker, prefetch 1 and 4",
         ", ".join(f"{name} {spread(r)}" for name, r in results.items()),
         f"at least {prefetch.TARGET}"),
    ]  # fmt: skip
    return body + "\n\n![prefetch](bench/plots/prefetch.png)", headline


def section_celery(tasks: int, noops: int, rounds: int) -> tuple[str, Headline]:
    with RedisServer() as server:
        correctness = celery_bench.correctness_table(server.url, tasks)
        results = celery_bench.overhead(server.url, noops, rounds)
    headline = [
        ("end-to-end throughput, never-limited FunnelTask / plain task",
         ", ".join(f"{pool} {spread(r)}" for pool, r in results.items()),
         "at least 0.95"),
    ]  # fmt: skip
    overhead = celery_bench.overhead_table(results, noops, rounds)
    return correctness + "\n\n" + overhead, headline


def section_accuracy(seconds: float, workers: list[int]) -> tuple[str, Headline]:
    results = accuracy.run(workers, seconds, "20/s")
    accuracy.plot(results, seconds, "20/s", PLOTS / "accuracy.png")
    headline = [
        (f"one 20/s limit, {seconds:g} s, {'/'.join(map(str, workers))} workers: starts per second",
         " / ".join(f"{results[n, 'funnel, reservation on']['rate']:.2f}" for n in workers),
         "Celery rate_limit: " + " / ".join(
             f"{results[n, 'Celery rate_limit (per worker)']['rate']:.2f}" for n in workers)),
    ]  # fmt: skip
    body = accuracy.table(results, seconds, "20/s") + "\n\n![accuracy](bench/plots/accuracy.png)"
    return body, headline


def section_memory(keys: int) -> tuple[str, Headline]:
    with RedisServer() as server:
        rows = memory.run(server.url, keys)
        version = server.version
    memory.plot(rows, PLOTS / "memory.png")
    headline = [
        (
            f"Redis memory per funnel, {keys} funnels",
            ", ".join(f"{name} {r['bytes']:.0f} B" for name, r in rows.items()),
            "",
        ),
    ]
    return memory.table(rows, version, keys) + "\n\n![memory](bench/plots/memory.png)", headline


def section_transport(quick: bool, command: str) -> tuple[str, Headline]:
    unpin()
    plan = transport.QUICK if quick else transport.Plan()
    body, results = transport.measure(plan, command, PLOTS / "transport.png")
    headline = [
        ("our broker transport / kombu's, saturated tasks/s, one worker -c 4 (no-op; bodies)",
         ", ".join(f"{label} {spread(r['rate'])}" for label, r in results.saturated.items()),
         f"at least {transport.TARGET}"),
        ("publish to start at idle, p50 / p99 ms: kombu's; ours; ours from a stock producer",
         "; ".join(f"{transport.percentile(v, 0.5) * 1e3:.1f} / {transport.percentile(v, 0.99) * 1e3:.1f}"
                   for v in results.latency.values()), "the last bounded by the 1 s poll"),
    ]  # fmt: skip
    return body + "\n\n![the broker transport](bench/plots/transport.png)", headline


def main() -> None:
    parser = argparse.ArgumentParser(description="every benchmark; writes BENCHMARKS.md")
    parser.add_argument("--quick", action="store_true", help="short runs (harness check)")
    parser.add_argument("parts", nargs="*", help=f"only these sections: {', '.join(PARTS)}")
    args = parser.parse_args()
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"no section {', '.join(sorted(unknown))}: one of {', '.join(PARTS)}")
    quick = args.quick
    started = time.monotonic()
    PLOTS.mkdir(exist_ok=True)
    command = " ".join(["python3 dev.py bench", *(["--quick"] if quick else []), *args.parts])
    steps: list[tuple[str, str, Callable[[], tuple[str, Headline]]]] = [
        ("Per decision", CORE, partial(section_core, *((300, 1) if quick else (2000, 5)))),
        ("Per decision, asyncio", CORE_ASYNC,
         partial(section_core_async, *((300, 1) if quick else (2000, 5)))),
        ("The gate's cost per task in one worker", WORKER,
         partial(section_worker, *((300, 1) if quick else (2000, 5)))),
        ("Instructions: per task and per decision", INSTRUCTIONS,
         partial(section_instructions, *((100, 200) if quick else (1000, 1000)))),
        ("FunnelTask against plain: prefetch 1 and 4", PREFETCH,
         partial(section_prefetch, *((300, 1, 0) if quick else (1000, 4, 300)))),
        ("Celery: correctness and overhead", CELERY,
         partial(section_celery, *((12, 50, 2) if quick else (40, 300, 16)))),
        ("Distributed accuracy", ACCURACY,
         partial(section_accuracy, *((5.0, [2]) if quick else (60.0, [2, 4])))),
        ("Memory", MEMORY, partial(section_memory, 2000 if quick else 100_000)),
        ("The broker transport", TRANSPORT, partial(section_transport, quick, command)),
    ]  # fmt: skip
    chosen = {PARTS[part] for part in args.parts}
    sections, headline = [], []
    for title, text, step in steps:
        if chosen and title not in chosen:
            continue
        print(f"{title} ...", flush=True)
        body, rows = step()
        sections.append((title, text, body))
        headline += rows
        print(body, flush=True)
    if chosen:  # the headline table stays the full run's
        splice(sections, command)
        return
    write(sections, started, command)
    if not quick:  # a harness check does not replace the published figures
        write_readme(headline, command)
    print(f"wrote BENCHMARKS.md and bench/plots/ in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
