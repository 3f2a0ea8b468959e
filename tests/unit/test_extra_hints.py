"""A missing optional dependency is named with a command that works while celery-funnel
is installed from a clone (README "Install"), not ``pip install 'celery-funnel[...]'``,
which needs the package on PyPI (issue 43, item 6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("module", "missing", "command"),
    [
        ("celery_funnel.dashboard", "starlette", "pip install starlette uvicorn"),
        ("celery_funnel.prometheus", "prometheus_client", "pip install prometheus-client"),
    ],
)
def test_the_hint_names_a_command_that_works(module: str, missing: str, command: str) -> None:
    code = f"import sys; sys.modules[{missing!r}] = None; import {module}"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: "), done.stderr
    assert command in last
    assert "in a clone of celery-funnel: pip install '.[" in last
    assert "celery-funnel[" not in last


def test_no_hint_asks_pypi_for_the_package() -> None:
    texts = [*ROOT.glob("celery_funnel/**/*.py"), ROOT / "README.md", *ROOT.glob("docs/*.md")]
    for path in texts:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "pip install" in line:
                assert "celery-funnel[" not in line, f"{path.relative_to(ROOT)}:{n}: {line}"
