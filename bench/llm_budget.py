#!/usr/bin/env python3
"""Token budgets: examples/llm_budget.py's 80 calls to a metered fake LLM API (tokens
300/s with a bucket of 1500, requests 10/s with a bucket of 5; 50-250 tokens a call,
150 on average) on two prefork workers of 4 processes, each call charged its estimate
of 250 tokens; with and without settling the tokens used after each call.

    python bench/llm_budget.py [--rounds 1]

Prints a table: tokens/s the upstream served (over the span of the calls), the share
of its 300/s used past its first full bucket, the 429s it answered, and the span.
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
from tests.integration.test_llm_budget import run_example


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for settle in (True, False):
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                seen = run_example(Path(tmp), settle)
            rows.append([
                "settled after each call" if settle else "estimate kept (no settle)",
                f"{seen['tokens_per_second']:.0f}", f"{100 * seen['used_of_rate']:.0f}%",
                str(seen["refused"]), f"{seen['span']:.1f}",
            ])  # fmt: skip
    print(markdown(
        "80 calls, 2 workers x 4 processes, tokens 300/s (bucket 1500), estimate 250",
        ["run", "tokens/s", "% of 300/s past the bucket", "429s", "span s"], rows,
    ))  # fmt: skip


if __name__ == "__main__":
    main()
