"""The README's samples run as written: the docs' "Testing your app" test
(docs/quickstart.md), against the README's quickstart ``tasks.py``, in a project folder
of their own (CI also runs the quickstart itself with the built wheel alone:
.ci/quickstart.py). The README stays a front page: at most 350 lines, its first runnable
Python within its first 60."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)


def block_after(anchor: str, page: Path = README) -> str:
    """The first ```python block after ``anchor`` in ``page``."""
    found = re.search(re.escape(anchor) + r"\s*```python\n(.*?)```", page.read_text(), re.S)
    assert found is not None, f"no python block after {anchor!r} in {page.name}"
    return found.group(1)


def test_the_readme_test_of_the_quickstart_passes(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(block_after("<!-- quickstart: tasks.py -->"))
    test = block_after("A test of the quickstart's `tasks.py`:", QUICKSTART)
    (tmp_path / "test_tasks.py").write_text(test)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:celery"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_readme_status_sample_is_the_real_output(tmp_path: Path, redis_url: str) -> None:
    """The README's ``celery -A tasks funnel status`` before any task ran is what the
    command prints for its quickstart ``tasks.py`` (it lacked the ``limit`` column)."""
    import redis

    (tmp_path / "tasks.py").write_text(block_after("<!-- quickstart: tasks.py -->"))
    redis.Redis.from_url(redis_url).flushall()
    text = README.read_text()
    found = re.search(r"```\n\$ celery -A tasks funnel status\n(.*?)```", text, re.S)
    assert found is not None
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "funnel", "status"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == found.group(1)
