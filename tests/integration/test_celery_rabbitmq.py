"""The shared limit across two real workers on RabbitMQ (127.0.0.1:5672), classic and
quorum queues. Skipped when RabbitMQ is not there, unless CI is set: then it fails."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest
import redis
from kombu.connection import Connection
from kombu.entity import Queue

from celery_funnel.testing import CeleryWorkers, peak
from tests.integration.proj import close_app, make_app, runs

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.rabbitmq]
ROOT = str(Path(__file__).resolve().parents[2])
AMQP = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _rabbitmq_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def amqp_url() -> str:
    if not _rabbitmq_up():
        if os.environ.get("CI"):
            pytest.fail("RabbitMQ is not listening on 127.0.0.1:5672 and CI is set")
        pytest.skip("RabbitMQ is not listening on 127.0.0.1:5672")
    return AMQP


@pytest.mark.parametrize("quorum", [False, True], ids=["classic", "quorum"])
def test_two_workers_share_one_funnel_on_rabbitmq(
    amqp_url: str, redis_url: str, redis_client: redis.Redis, quorum: bool
) -> None:
    redis_client.flushall()
    queue = f"funnel-test-{uuid.uuid4().hex[:8]}"
    env = {
        "FUNNEL_TEST_BROKER": amqp_url,
        "FUNNEL_TEST_REDIS": redis_url,
        "FUNNEL_TEST_QUEUE": queue,
        "FUNNEL_TEST_QUORUM": "1" if quorum else "0",
    }
    app = make_app(amqp_url, redis_url, queue=queue, quorum=quorum)
    try:
        with CeleryWorkers("tests.integration.proj", 2, env, "-c", "2", "-Q", queue, cwd=ROOT):
            results = [app.tasks["proj.limited"].delay(i) for i in range(20)]
            assert sorted(r.get(timeout=90) for r in results) == list(range(20))
        recorded = [r for r in runs(redis_url) if r["name"] == "proj.limited"]
        assert sorted(r["args"][0] for r in recorded) == list(range(20)), "each ran exactly once"
        assert peak([r["at"] for r in recorded]) <= 11  # 10/s, capacity 1
    finally:
        close_app(app)
        with Connection(amqp_url) as connection:
            Queue(queue, channel=connection.channel()).delete()
