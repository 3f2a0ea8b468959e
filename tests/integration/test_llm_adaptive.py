"""The adaptive rate on real workers: examples/llm_adaptive.py's 300 calls to a fake
LLM API that publishes no limits (no rate-limit header, no Retry-After) and silently
halves its request limit (20/s to 10/s) three seconds in, on two prefork workers of 4
processes, the task's ``requests`` limit adaptive: the halving draws 429s, then they
stop (80 calls and more run after the last one), and every call reaches the
upstream once with a 200. The time from the halving to the last 429, with and
without the adaptive mode, is in bench/llm_adaptive.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_llm_budget import run_llm_example

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.exclusive]

CALLS = 300


def test_adaptive_rate_stops_the_429s_after_a_silent_halving(tmp_path: Path) -> None:
    seen = run_llm_example(tmp_path, "llm_adaptive", {"LLM_ADAPTIVE": "1"})
    accepted = sorted(n for _at, n, status, _used in seen["log"] if status == 200)
    assert accepted == list(range(CALLS)), seen["output"]  # every call, once
    refused = [at for at, _n, status, _used in seen["log"] if status == 429]
    assert refused, seen["output"]  # the halving was felt
    assert min(refused) >= seen["halved_at"], seen["output"]
    after = [at for at, _n, status, _used in seen["log"] if status == 200 and at > max(refused)]
    assert len(after) >= 80, seen["output"]  # then none for 80 calls (8 s at 10/s) and more
