"""Every example in examples/ runs end to end (its own checks decide), and the
docker-compose file that runs the quickstart is valid and keeps Redis private."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from celery_funnel.testing import RedisServer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py") if not p.stem.startswith("_"))
# run, with their own checks and more, by test_llm_budget.py and test_llm_adaptive.py
# (alone: their checks hold the upstream's token rate to its bucket within milliseconds)
TESTED_ELSEWHERE = {"llm_budget", "llm_adaptive"}


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in EXAMPLES if n not in TESTED_ELSEWHERE])
def test_example_runs_and_its_checks_pass(name: str) -> None:
    with RedisServer() as server:
        done = subprocess.run(
            [sys.executable, f"examples/{name}.py"],
            cwd=ROOT,
            env={**os.environ, "REDIS_URL": server.url},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "OK " in done.stdout, output
    assert "FAILED" not in done.stdout, output


def test_examples_cover_what_the_readme_promises() -> None:
    assert set(EXAMPLES) >= {
        "quickstart", "per_customer", "worker_wide", "several_limits",
        "django_settings", "upstream_429", *TESTED_ELSEWHERE,
    }  # fmt: skip


def test_compose_file_runs_the_quickstart_with_redis_on_localhost_only() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"redis", "worker", "producer"}
    ports = [str(p) for service in services.values() for p in service.get("ports", [])]
    assert ports, "Redis is published for the CLI"
    assert all(p.startswith("127.0.0.1:") for p in ports), ports
    assert services["worker"]["command"][:3] == ["celery", "-A", "quickstart"]
    assert services["producer"]["command"] == ["python", "quickstart.py"]
    assert services["producer"]["environment"]["EXAMPLE_WORKERS"] == "0"
    assert (ROOT / services["worker"]["build"] / "Dockerfile").exists()


def _compose() -> list[str] | None:
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


@pytest.mark.skipif(_compose() is None, reason="no docker compose client on this machine")
def test_compose_config_validates() -> None:
    command = _compose()
    assert command is not None
    done = subprocess.run(
        [*command, "config", "-q"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
