"""The README's first command runs: real workers, one funnel, a summary at the end; every
command it prints works when pasted; it stops what it started however it ends; the
sample of its output in docs/quickstart.md is a real run (its shape checked against
one; ``CELERY_FUNNEL_WRITE_SAMPLES=1`` writes the run into the page)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import pytest

from tests.leakcheck import marked_processes, sigterm_held_back
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]

PROBE = "CELERY_FUNNEL_DEMO_PROBE"
# a stopped demo has ended by then, or it hangs: a warm shutdown of each worker may take
# up to 20 s before it is killed (testing's stop), one after the other, then Redis's;
# a loaded machine took more than the 60 s this was
STOPPED = 180


def demo_command(*options: str) -> list[str]:
    return [sys.executable, "-m", "celery_funnel", "demo", *options]


@contextmanager
def ctrl_c_as_at_a_terminal() -> Iterator[None]:
    """Processes started inside get SIGINT at its default, as a terminal's program does:
    a run started in the background by a shell (``dev.py test --load &``) ignores it,
    and an ignored SIGINT is inherited through exec (Python then installs no handler)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if before is not None:  # None: set outside Python, nothing to put back
            signal.signal(signal.SIGINT, before)


@contextmanager
def running_demo(
    tmp_path: Path, *options: str, held_back: bool = False
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The demo, started until its tasks are sent; yields it and its "watch" hint line.
    Every process it starts carries a probe in its environment, for the leak check.
    ``held_back``: it starts with SIGTERM blocked, as a parent's signal mask can leave it."""
    probe = uuid.uuid4().hex
    with sigterm_held_back() if held_back else nullcontext(), ctrl_c_as_at_a_terminal():
        demo = subprocess.Popen(
            demo_command(*options), env={**os.environ, PROBE: probe},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
        )  # fmt: skip
    assert demo.stdout is not None
    try:
        hint = ""
        for line in demo.stdout:  # the demo prints the command once its tasks are sent
            if line.startswith("watch the funnel"):
                hint = next(demo.stdout).strip()
                break
        assert hint, "the demo says how to watch its funnel"
        assert marked_processes(probe, PROBE), "the demo runs its workers and Redis"
        yield demo, hint
    finally:
        if demo.poll() is None:
            demo.kill()
        demo.communicate(timeout=STOPPED)
        # nothing it started is left, however it ended (a hang names what is left)
        wait_for(
            lambda: not marked_processes(probe, PROBE), 30, partial(marked_processes, probe, PROBE)
        )


def test_demo_runs_real_workers_through_one_funnel(tmp_path: Path) -> None:
    probe = uuid.uuid4().hex
    done = subprocess.run(
        demo_command("--tasks", "12", "--rate", "10/s"), env={**os.environ, PROBE: probe},
        capture_output=True, text=True, timeout=180, cwd=str(tmp_path), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 of 12 tasks ran" in done.stdout
    assert "w1@" in done.stdout
    assert "w2@" in done.stdout
    assert not marked_processes(probe, PROBE), "the demo stopped its workers and Redis"


def test_the_printed_status_command_works_when_pasted(tmp_path: Path) -> None:
    with running_demo(tmp_path, "--tasks", "40", "--rate", "5/s") as (_, hint):
        done = subprocess.run(
            f"{hint} --json", shell=True, capture_output=True, text=True, timeout=60,
            check=False, env={"PATH": os.environ.get("PATH", "")},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        rows = [r for r in json.loads(done.stdout) if r.get("rate") == "5/s"]
        assert rows, done.stdout
        assert rows[0]["capacity"] == 5


@pytest.mark.parametrize(
    ("number", "held_back"),
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["SIGTERM", "Ctrl-C", "SIGTERM blocked by the parent's mask"],
)
def test_a_stopped_demo_stops_its_workers_and_redis(
    tmp_path: Path, number: int, held_back: bool
) -> None:
    options = ("--tasks", "200", "--rate", "2/s")
    with running_demo(tmp_path, *options, held_back=held_back) as (demo, _):
        demo.send_signal(number)
        out, err = demo.communicate(timeout=STOPPED)
        assert demo.returncode == 130, out + err
        assert "Traceback" not in err, err
        assert err.strip().splitlines() == [
            "interrupted: the demo's workers and Redis are stopped"
        ], err


QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
SAMPLE = re.compile(r"(A run on a 2-core machine:\n\n```\n)(.*?)(```)", re.S)


def shape(text: str) -> list[str]:
    """The lines of a demo's output with every number a ``N`` and runs of alike lines
    (the per-second table) as one: what any run of the same demo prints."""
    shapes: list[str] = []
    for line in text.splitlines():
        alike = re.sub(r"\d+(\.\d+)?", "N", " ".join(line.split()))
        if not shapes or shapes[-1] != alike:
            shapes.append(alike)
    return shapes


@pytest.mark.timeout(600)  # past the demo run's own 300 s timeout, which shows its output
def test_the_quickstart_sample_is_a_real_run(tmp_path: Path) -> None:
    """The demo as the page runs it (its defaults): the page's sample says what it says
    (it said "re-queued 0 times" and "no task was parked" while the demo parked 44)."""
    done = subprocess.run(
        demo_command(), capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    real = done.stdout[done.stdout.index("second | started") :]
    real = re.sub(r"\b(w\d+)@\S+", r"\1@vm", real)  # the machine's name
    page = QUICKSTART.read_text()
    found = SAMPLE.search(page)
    assert found is not None, "the sample's block"
    if os.environ.get("CELERY_FUNNEL_WRITE_SAMPLES") == "1":
        QUICKSTART.write_text(page[: found.start(2)] + real + page[found.end(2) :])
        found = SAMPLE.search(QUICKSTART.read_text())
        assert found is not None
    assert shape(found.group(2)) == shape(real), real
    assert re.search(r"deferred +\d+ tasks, \d+ times: held \d+, parked \d+, republished", real)
