#!/usr/bin/env python3
"""celery-funnel's broker transport (``celery_funnel.transport:Transport``) against
kombu's own Redis transport, in one run, with real ``celery worker`` processes of a
plain Celery app (no funnel, ``bench/_transport_app.py``) on private redis-servers:

- saturated: one worker (-c 4, prefork and threads) drains no-op tasks queued before
  it started; tasks/s between the first and the last start, and the broker's CPU per
  message (publish, fetch and ack), the two transports in alternating rounds, a fresh
  server each; the same with bodies of 1 KB to 1 MB (prefork);
- publish to start at idle: one idle worker per row, each on its own server, tasks sent
  one at a time to each in turn; p50 and p99; the third row is a stock producer (no
  wake marker) feeding our worker: the 1 s fallback poll;
- idle: 20 workers (-P solo) per transport, each group on its own server, and a server
  with no client, in the same windows: the broker's CPU and commands per second.

    python bench/transport.py [--quick] [--plot bench/plots/transport.png]
    python3 dev.py bench transport   # this section of BENCHMARKS.md, and the plot
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

import argparse
import dataclasses
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

import celery
import kombu

from bench import _transport_rounds as rounds
from bench._plot import pyplot, save
from bench._table import markdown, spread
from celery_funnel.testing import RedisServer

TARGET = 0.97  # our transport's saturated tasks/s over kombu's (issue 54)
KB = 1024


@dataclass(frozen=True)
class Plan:
    """How much to run (the defaults: about 10 minutes on 2 cores)."""

    tasks: int = 2000  # no-op tasks per saturated round
    rounds: int = 5  # saturated rounds per transport
    pools: tuple[str, ...] = ("prefork", "threads")
    bodies: dict[int, int] = field(  # body bytes: tasks per round
        default_factory=lambda: {KB: 1500, 10 * KB: 1000, 100 * KB: 400, 1024 * KB: 100}
    )
    body_rounds: int = 3
    samples: int = 150  # publish-to-start samples per row (the fallback row: a third)
    idle_workers: int = 20
    window: float = 10.0  # seconds per idle window
    windows: int = 3


QUICK = Plan(300, 1, ("prefork",), {KB: 200, 1024 * KB: 20}, 1, 15, 4, 2.0, 1)
Ratio = dict[str, float]


@dataclass
class Results:
    """Saturated rows (label: per transport, medians; ratios ours / stock), publish to
    start (row: seconds), idle (row: per window), and the load averages around them."""

    saturated: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)
    idle: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    load: list[float] = field(default_factory=list)


def ratio(stock: list[float], ours: list[float]) -> Ratio:
    """Median, lowest and highest of the paired ratios ours / stock (NaN where no
    stock figure is above 0: a CPU too small for /proc's ticks)."""
    got = [o / s for s, o in zip(stock, ours, strict=True) if s > 0] or [math.nan]
    return {"ratio": statistics.median(got), "low": min(got), "high": max(got)}


def spread_of(r: Ratio) -> str:
    return spread(r) if math.isfinite(r["ratio"]) else "n/a"


def paired(pool: str, count: int, body: int, number: int) -> dict[str, dict[str, float]]:
    """``number`` saturated rounds of each transport, taking turns; medians and ratios."""
    got: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for turn in range(number):
        for ours in (False, True) if turn % 2 == 0 else (True, False):
            got[ours].append(rounds.saturated(ours, pool, count, body))
    out: dict[str, dict[str, float]] = {}
    for name, ours in (("stock", False), ("ours", True)):
        out[name] = {k: statistics.median(r[k] for r in got[ours]) for k in got[ours][0]}
    for key in ("rate", "cpu_us", "worker_us"):
        out[key] = ratio([r[key] for r in got[False]], [r[key] for r in got[True]])
    return out


def size(body: int) -> str:
    return f"{body // (1024 * KB)} MB" if body >= 1024 * KB else f"{body // KB} KB"


def run(plan: Plan) -> Results:
    """Every measurement of ``plan``; progress on stderr."""
    results = Results(load=[os.getloadavg()[0]])
    for pool in plan.pools:
        print(f"  saturated, no-op, {pool} ...", flush=True, file=sys.stderr)
        label = f"no-op, {pool} -c 4"
        results.saturated[label] = paired(pool, plan.tasks, 0, plan.rounds)
    for body, count in plan.bodies.items():
        print(f"  saturated, {size(body)} bodies ...", flush=True, file=sys.stderr)
        label = f"{size(body)} body, prefork -c 4"
        results.saturated[label] = paired("prefork", count, body, plan.body_rounds)
    print("  publish to start ...", flush=True, file=sys.stderr)
    results.latency = rounds.latency(plan.samples, 3)
    print(f"  {plan.idle_workers} idle workers ...", flush=True, file=sys.stderr)
    results.idle = rounds.idle(plan.idle_workers, plan.window, plan.windows)
    results.load.append(os.getloadavg()[0])
    return results


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def _saturated_rows(results: Results) -> list[list[str]]:
    rows = []
    for label, r in results.saturated.items():
        stock, ours = r["stock"], r["ours"]
        rows.append(
            [
                f"{label}: tasks/s",
                f"{stock['rate']:.0f}",
                f"{ours['rate']:.0f}",
                spread(r["rate"]),
                f"{stock['fetch_us']:.1f} / {ours['fetch_us']:.1f}",
            ]
        )
        for key, name in (
            ("cpu_us", "broker CPU µs per message"),
            ("worker_us", "worker CPU µs per task"),
        ):
            rows.append(
                [f"{label}: {name}", f"{stock[key]:.0f}", f"{ours[key]:.0f}", spread(r[key]), ""]
            )
    return rows


def _latency_rows(results: Results) -> list[list[str]]:
    got = results.latency
    rows = []
    for name, share in (("p50", 0.5), ("p99", 0.99)):
        for against, label in (("ours", ""), ("fallback", ", a stock producer to our worker")):
            stock, ours = percentile(got["stock"], share), percentile(got[against], share)
            rows.append([f"publish to start at idle, {name}{label} (ms; {len(got[against])} tasks)",
                         f"{stock * 1e3:.2f}", f"{ours * 1e3:.2f}", f"{ours / stock:.2f}", ""])  # fmt: skip
    return rows


def _idle_rows(results: Results, workers: int) -> list[list[str]]:
    got, rows = results.idle, []
    for key, label in (("cpu_ms", "broker CPU ms per s"),
                       ("commands", "broker commands per s, a script's own calls included"),
                       ("polls", "polls per s (BRPOP, EVAL/EVALSHA)"),
                       ("workers_ms", "the workers' CPU ms per s")):  # fmt: skip
        stock, ours = [w[key] for w in got["stock"]], [w[key] for w in got["ours"]]
        bare = statistics.median(w[key] for w in got["none"])
        name = f"{workers} idle workers: {label}" + (
            "" if key in ("workers_ms", "polls") else f" (no client: {bare:.2f})"
        )
        rows.append([name, f"{statistics.median(stock):.2f}", f"{statistics.median(ours):.2f}",
                     spread_of(ratio(stock, ours)), ""])  # fmt: skip
    return rows


def table(results: Results, plan: Plan, version: str, command: str) -> str:
    """The markdown table: one row per figure, kombu's transport against ours."""
    caption = (
        f"`{command}`: Redis {version}, Celery {celery.__version__}, kombu"
        f" {kombu.__version__}; load average (1 min) {results.load[0]:.2f} at the start,"
        f" {results.load[-1]:.2f} at the end. Saturated: one worker (-c 4, prefetch 4)"
        f" draining {plan.tasks} no-op tasks (bodies: {', '.join(f'{c} of {size(b)}' for b, c in plan.bodies.items())})"
        f" queued before it started, {plan.rounds} rounds per transport ({plan.body_rounds} with"
        " bodies) taking turns, a fresh server each; tasks/s between the first and the last"
        " start, the broker's CPU per message from before the publishes to the last start;"
        " medians, and the median of paired rounds' ratios with their range. Fetch: the server's"
        " µs per message in BRPOP + HSET + ZADD (kombu's) or EVAL/EVALSHA + BRPOP (ours)."
        " Publish to start: one idle prefork -c 1 worker per row on its own server, sends taking"
        " turns after 20-100 ms pauses (a stock producer's: 0-1 s more, to spread them over"
        f" the 1 s poll); kombu's figure in those rows is the same. Idle: {plan.windows}"
        f" windows of {plan.window:g} s, every server in the same windows."
    )
    header = ["figure", "kombu's transport", "celery-funnel's transport",
              "ours / kombu's [range]", "fetch µs per message, kombu's / ours"]  # fmt: skip
    rows = (
        _saturated_rows(results) + _latency_rows(results) + _idle_rows(results, plan.idle_workers)
    )
    return markdown(caption, header, rows)


COLOURS = {"stock": "tab:orange", "ours": "tab:blue", "fallback": "tab:green", "none": "tab:grey"}


def plot(results: Results, path: Path, workers: int) -> None:
    """Four panels: saturated tasks/s and broker CPU per message (ours / kombu's),
    publish to start at idle, and the idle broker's CPU."""
    plt = pyplot()
    fig, ((rates, cpu), (late, idle)) = plt.subplots(2, 2, figsize=(12, 8))
    _ratios(rates, results, {"rate": "tasks/s"}, "saturated tasks/s")
    rates.axhline(TARGET, color="black", linestyle="--", linewidth=0.8, label=f"target {TARGET}")
    rates.legend(loc="lower right", fontsize=8)
    figures = {"cpu_us": "the broker's, per message", "worker_us": "the worker's, per task"}
    _ratios(cpu, results, figures, "saturated: CPU")
    names = {"stock": "kombu's", "ours": "ours", "fallback": "ours, stock producer (1 s poll)"}
    for row, values in results.latency.items():
        ordered = sorted(v * 1e3 for v in values)
        shares = [(i + 1) / len(ordered) for i in range(len(ordered))]
        late.step(ordered, shares, where="post", label=names[row], color=COLOURS[row])
    late.set_xscale("log")
    late.set(xlabel="ms", ylabel="share of tasks", title="publish to start, idle worker")
    late.legend(loc="lower right", fontsize=8)
    late.grid(alpha=0.3)
    rows = {"stock": "kombu's", "ours": "ours", "none": "no client"}
    median = {k: {f: statistics.median(w[f] for w in results.idle[k]) for f in ("cpu_ms", "polls")}
              for k in rows}  # fmt: skip
    idle.bar(list(rows.values()), [median[k]["cpu_ms"] for k in rows],
             color=[COLOURS[k] for k in rows])  # fmt: skip
    for x, k in enumerate(rows):
        note = f"{median[k]['polls']:.0f} polls/s"
        idle.annotate(note, (x, median[k]["cpu_ms"]), ha="center", va="bottom", fontsize=8)
    idle.set(ylabel="ms per s", title=f"broker CPU, {workers} idle workers")
    idle.grid(alpha=0.3, axis="y")
    save(fig, path)


def _ratios(ax: Any, results: Results, keys: dict[str, str], title: str) -> None:
    """Per saturated row, a bar per figure of ``keys`` (key: its legend): the median
    ratio ours / kombu's with its range."""
    labels = list(results.saturated)
    width = 0.8 / len(keys)
    for number, (key, legend) in enumerate(keys.items()):
        got = [results.saturated[n][key] for n in labels]
        errors = [[r["ratio"] - r["low"] for r in got], [r["high"] - r["ratio"] for r in got]]
        xs = [x + (number - (len(keys) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, [r["ratio"] for r in got], width, yerr=errors, capsize=3, label=legend,
               color=("tab:blue", "tab:purple")[number])  # fmt: skip
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(ylabel="ours / kombu's", title=title)
    ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=8, ha="right")
    ax.grid(alpha=0.3, axis="y")
    if len(keys) > 1:
        ax.legend(loc="upper right", fontsize=8)


def measure(plan: Plan, command: str, plot_to: Path | None) -> tuple[str, Results]:
    """Run ``plan``: the table (and the plot, when ``plot_to``)."""
    results = run(plan)
    if plot_to is not None:
        plot(results, plot_to, plan.idle_workers)
    return table(results, plan, RedisServer().version, command), results


def main() -> None:
    parser = argparse.ArgumentParser(description="our broker transport against kombu's")
    parser.add_argument("--quick", action="store_true", help="a short run (harness check)")
    parser.add_argument("--rounds", type=int, help="saturated rounds per transport")
    parser.add_argument("--plot", type=Path, help="write the plot here (PNG)")
    parser.add_argument("--save", type=Path, help="write the measurements here (JSON)")
    args = parser.parse_args()
    plan = QUICK if args.quick else Plan()
    if args.rounds:
        plan = dataclasses.replace(plan, rounds=args.rounds)
    command = " ".join(["python bench/transport.py", *sys.argv[1:]])
    text, results = measure(plan, command, args.plot)
    if args.save:
        args.save.write_text(json.dumps(dataclasses.asdict(results), indent=1))
    print(text)


if __name__ == "__main__":
    main()
