"""Token budgets on real workers: examples/llm_budget.py's 80 calls to a metered fake
LLM API (tokens 300/s, bucket 1500; requests 10/s, bucket 5; tokens charged as used)
on two prefork workers of 4 processes, each call charged its estimate (250 tokens)
and settling what it used: no 429, at least 90% of the token rate used, every call
once. The same run without settling is in bench/llm_budget.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from celery_funnel.testing import RedisServer, tokens_of

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.exclusive]

ROOT = Path(__file__).resolve().parents[2]
CALLS = 80


def run_example(tmp_path: Path, settle: bool) -> dict[str, Any]:
    """Run the example (its own Redis, upstream and workers) and read what the
    upstream saw."""
    return run_llm_example(tmp_path, "llm_budget", {"LLM_SETTLE": "1" if settle else "0"})


def run_llm_example(tmp_path: Path, name: str, options: dict[str, str]) -> dict[str, Any]:
    """Run ``examples/<name>.py`` with ``options`` in its environment (its own Redis,
    upstream and workers), check that it passes its own checks (as test_examples.py
    checks every other example), and read the summary it writes (``LLM_SUMMARY``)."""
    summary = tmp_path / "summary.json"
    with RedisServer() as server:
        env = {**os.environ, "REDIS_URL": server.url, "LLM_SUMMARY": str(summary), **options}
        done = subprocess.run(
            [sys.executable, f"examples/{name}.py"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert summary.exists(), output
    assert done.returncode == 0, output
    assert "OK " in done.stdout, output
    assert "FAILED" not in done.stdout, output
    seen: dict[str, Any] = json.loads(summary.read_text())
    seen["output"] = done.stdout
    return seen


def test_settled_tokens_use_the_upstreams_rate_without_a_429(tmp_path: Path) -> None:
    seen = run_example(tmp_path, settle=True)
    accepted = sorted(n for _at, n, status, _used in seen["log"] if status == 200)
    assert accepted == list(range(CALLS)), seen["output"]  # every call, once
    assert seen["tokens"] == sum(tokens_of(n) for n in range(CALLS))
    assert seen["refused"] == 0, seen["refusals"]
    assert seen["used_of_rate"] >= 0.9, seen["output"]
