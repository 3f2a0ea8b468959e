#!/usr/bin/env python3
"""Redis memory per funnel key, for every limiter, at 100 000 keys.

For each limiter, on a fresh private Redis: ``used_memory`` before and after one
decision on each of N distinct keys (pipelined, the same EVALSHA the public call makes,
with a 1/h rate so that no key expires meanwhile), divided by N; and ``MEMORY USAGE`` of
one key and the Redis keys one funnel leaves.

    python bench/memory.py [--keys 100000] [--redis URL]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import redis

sys.path.insert(0, str(HERE.parent))

from bench._plot import pyplot, save
from celery_funnel._limiter.backends.base import Funnel
from celery_funnel._limiter.scripts import Arg, Reply, Script
from celery_funnel.testing import RedisServer

BATCH = 2000
HOUR = 3600.0


class _Call(Exception):  # noqa: N818 - a carrier, not an error
    def __init__(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> None:
        super().__init__(script.name)
        self.script = script
        self.keys: list[str] = list(keys)
        self.call_args: list[Arg] = list(args)


class _Capture(Funnel):
    """A funnel that, instead of running a script, hands back what it would run."""

    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        raise _Call(script, keys, args)

    def reset(self, key: str) -> None:
        raise NotImplementedError


def capture(call: Callable[[Funnel], Any]) -> _Call:
    """The script, keys and arguments of one public call."""
    try:
        call(_Capture())
    except _Call as made:
        return made
    raise AssertionError("the call ran no script")


T0 = 1_700_000_000.0  # the clock of the calls that pass one (now=)
LIMITERS: dict[str, Callable[..., Any]] = {  # (funnel, key, step)
    "gcra throttle": lambda f, key, step: f.throttle(key, 14, 30, HOUR),
    "reserve (booked, with ticket)": lambda f, key, step: f.reserve(
        key, 0, 1, HOUR, ticket="t", late=HOUR
    ),
    "fixed window": lambda f, key, step: f.fixed_window(key, 100, HOUR),
    "sliding window (10 sub-windows, 1 used)": lambda f, key, step: f.sliding_window(
        key, 100, HOUR
    ),
    # one decision in each sub-window: the steady state of a busy funnel
    "sliding window (10 sub-windows, all used)": lambda f, key, step: f.sliding_window(
        key, 100, HOUR, now=T0 + step * HOUR / 10
    ),
    "sliding log (1 entry)": lambda f, key, step: f.sliding_log(key, 100, HOUR),
}
STEPS = {"reserve (booked, with ticket)": 2, "sliding window (10 sub-windows, all used)": 10}


def measure(url: str, name: str, keys: int) -> dict[str, float]:
    """Bytes per funnel for one limiter; a reservation is booked behind one admitted."""
    client = redis.Redis.from_url(url)
    client.flushall()
    limiter = LIMITERS[name]
    sample = capture(lambda f: limiter(f, "sample", 0))
    client.script_load(sample.script.source)
    steps = STEPS.get(name, 1)
    before = int(client.info("memory")["used_memory"])
    for start in range(0, keys, BATCH):
        with client.pipeline(transaction=False) as pipe:
            for n in range(start, min(start + BATCH, keys)):
                for step in range(steps):  # a second reservation books a slot
                    call = capture(partial(limiter, key=f"funnel:bench:{n}", step=step))
                    pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.call_args)
            pipe.execute()
    after = int(client.info("memory")["used_memory"])
    redis_keys = int(client.dbsize())
    usage = sum(int(client.memory_usage(k) or 0) for k in client.scan_iter("*funnel:bench:0[}#:]*"))
    usage += int(client.memory_usage("funnel:bench:0") or 0)
    client.close()
    return {
        "bytes": (after - before) / keys,
        "redis_keys": redis_keys / keys,
        "usage": float(usage),
    }


def run(url: str, keys: int) -> dict[str, dict[str, float]]:
    return {name: measure(url, name, keys) for name in LIMITERS}


def table(rows: dict[str, dict[str, float]], version: str, keys: int) -> str:
    head = [
        f"Redis {version}, {keys} funnels per limiter, each after one decision"
        " (reservation: one admitted, one booked; sliding window, all used: one in each sub-window)",
        "",
        "| limiter | bytes per funnel (used_memory) | Redis keys per funnel | MEMORY USAGE |",
        "| --- | ---: | ---: | ---: |",
    ]
    body = [
        f"| {name} | {r['bytes']:.0f} | {r['redis_keys']:.0f} | {r['usage']:.0f} |"
        for name, r in rows.items()
    ]
    return "\n".join(head + body)


def plot(rows: dict[str, dict[str, float]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.barh(list(rows), [r["bytes"] for r in rows.values()], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("bytes of Redis memory per funnel (100 000 funnels)")
    ax.grid(axis="x", alpha=0.3)
    save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description="Redis memory per funnel key")
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--redis", help="use this Redis (it is flushed!) not a private one")
    args = parser.parse_args()
    if args.redis:
        version = redis.Redis.from_url(args.redis).info("server")["redis_version"]
        print(table(run(args.redis, args.keys), version, args.keys))
        return
    with RedisServer() as server:
        print(table(run(server.url, args.keys), server.version, args.keys))


if __name__ == "__main__":
    main()
