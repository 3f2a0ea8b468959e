#!/usr/bin/env python3
"""Set up and run the project on a fresh machine with nothing but Python >= 3.10.

    python3 dev.py test    # lint, type-check and run the whole test suite
    python3 dev.py demo    # a funnel demo on a private Redis (no server to install)
    python3 dev.py bench   # every benchmark: writes BENCHMARKS.md and bench/plots/

Each command creates ./.venv on first use and installs the project into it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def sh(*args: str | Path) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    code = subprocess.call([str(a) for a in args], cwd=ROOT)
    if code:
        sys.exit(code)


def ensure(extras: str) -> None:
    if not PY.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
        sh(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
    stamp = VENV / f".installed-{extras}"
    if not stamp.exists() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        sh(PY, "-m", "pip", "install", "-q", "-e", f".[{extras}]")
        stamp.touch()


def main(argv: list[str]) -> None:
    command, rest = (argv[0], argv[1:]) if argv else ("test", [])
    if command == "test":
        ensure("test")
        sh(BIN / "ruff", "check", ".")
        sh(BIN / "ruff", "format", "--check", ".")
        sh(BIN / "mypy")
        sh(PY, "-m", "pytest", *rest)
    elif command == "demo":
        ensure("demo")
        sh(PY, "-m", "celery_funnel", "demo", *rest)
    elif command == "bench":
        ensure("test,bench")
        sh(PY, "bench/run.py", *rest)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
