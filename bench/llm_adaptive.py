#!/usr/bin/env python3
"""The adaptive rate: examples/llm_adaptive.py's 300 calls to a fake LLM API that
publishes no limits and silently halves its request limit (20/s to 10/s) three
seconds in, on two prefork workers of 4 processes; with and without ``"adaptive"`` on
the task's 20/s ``requests`` limit (a 429 halves the rate, a success adds 1/s a
second). Without it, each 429 still holds the funnel for a second (funnel_backoff).

    python bench/llm_adaptive.py [--rounds 1]

Prints a table: the 429s after the halving, the time from the halving to the last
429, the calls/s the upstream accepted before the halving and after the last 429
(over the calls after it), and the adaptive rate in force at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import tempfile

ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench._table import markdown
from tests.integration.test_llm_budget import run_llm_example


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for adaptive in (True, False):
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                seen = run_llm_example(
                    Path(tmp), "llm_adaptive", {"LLM_ADAPTIVE": str(int(adaptive))}
                )
            last, rate = seen["last_429_after"], seen["adaptive_rate"]
            end = seen["log"][-1][0] - seen["halved_at"]
            rows.append([
                "adaptive" if adaptive else "fixed 20/s", str(seen["refused_after_halving"]),
                "-" if last is None else f"{last:.1f}", f"{end:.1f}",
                f"{seen['rate_before']:.1f}", f"{seen['rate_after']:.1f}",
                str(seen["ok_after_last_429"]),
                "-" if not adaptive else "20 (max)" if rate is None else f"{rate:.1f}",
            ])  # fmt: skip
    print(markdown(
        "300 calls, 2 workers x 4 processes; the upstream halves 20/s -> 10/s at +3 s, silently",
        ["run", "429s after halving", "halving -> last 429 s", "halving -> end s",
         "calls/s before", "calls/s after last 429", "calls after last 429",
         "adaptive rate at end /s"], rows,
    ))  # fmt: skip


if __name__ == "__main__":
    main()
