"""What a real ``celery worker`` says at start about the funnels' Redis (issue 55).

- A funnels' Redis that has never answered (item 5): the worker starts (a Redis down
  now may answer later, as Celery waits for its broker; the outage policy decides what
  its tasks do meanwhile), and its error line names ``funnel_redis_url`` and its value,
  the password masked, as the ``celery funnel`` command does (it said only ``Redis
  failed PING: Error 111 ...``). Once that Redis answers, the task sent meanwhile runs.
- The funnels on the broker's own Redis (item 7): one line says where tasks are parked
  (two near-identical INFO lines said it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from celery_funnel.testing import CeleryWorkers, RedisServer, free_port
from tests.integration.proj import close_app, make_app, runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])
SECRET = "s3cret-never-logged"
HOST = "10.0.0.5:6379"  # the docs' sample's


def test_a_worker_whose_funnels_redis_never_answered_names_the_setting(
    standalone_url: str,
) -> None:
    port = free_port()
    funnels = f"redis://default:{SECRET}@127.0.0.1:{port}/0"
    env = {
        "FUNNEL_TEST_BROKER": standalone_url, "FUNNEL_TEST_REDIS": funnels,
        "FUNNEL_TEST_STORE": standalone_url,
    }  # fmt: skip
    app = make_app(standalone_url, funnels, store_url=standalone_url, task_ignore_result=True)
    try:
        with CeleryWorkers(
            "tests.integration.proj", 1, env, "-P", "solo", "-Q", "proj", cwd=ROOT
        ) as workers:  # it starts
            logs = workers.logs()
            errors = [line for line in logs.splitlines() if "ERROR" in line]
            named = f"funnel_redis_url='redis://default:****@127.0.0.1:{port}/0'"
            (line,) = [e for e in errors if named in e]
            assert re.search(rf"{re.escape(named)}: Redis failed PING: .*{port}", line), line
            assert "The worker starts; its tasks with a funnel wait until it answers" in line
            assert "funnel_on_backend_error='defer'" in line
            assert SECRET not in logs
            # docs/operations.md's sample is this line, on another host
            sample = line[line.index("celery-funnel:") :].replace(f"127.0.0.1:{port}", HOST)
            assert f"\n{sample}\n" in (Path(ROOT) / "docs" / "operations.md").read_text()
            app.tasks["proj.limited"].delay(1)  # waits while the funnels' Redis is down
            # a default user that takes any password (so that the server's own start
            # check needs none): AUTH default <SECRET> passes
            with RedisServer(None, port, "--user", "default", "on", "nopass", "~*", "&*", "+@all"):
                wait_for(lambda: [r["args"] for r in runs(standalone_url)] == [[1]], 60)
            assert SECRET not in workers.logs()
    finally:
        close_app(app)


def test_one_line_says_where_tasks_are_parked_on_the_brokers_redis() -> None:
    """The funnels on the broker's own Redis server, without an append-only file (a
    server of its own: the pool's servers keep theirs for the tests that park there)."""
    with RedisServer() as broker:
        env = {"FUNNEL_TEST_BROKER": broker.url, "FUNNEL_TEST_REDIS": broker.url}
        with CeleryWorkers("tests.integration.proj", 1, env, "-P", "solo", cwd=ROOT) as workers:
            logs = workers.logs()
    said = [line for line in logs.splitlines() if "celery-funnel" in line and "parked" in line]
    assert len(said) == 1, said
    assert "parking is on: the funnels' Redis is the broker's own Redis server" in said[0]
