"""The funnels' Redis password never shows where Celery shows a worker's configuration:
``celery inspect conf`` (what Flower's Config tab reads), from a real worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker

from celery_funnel.testing import RedisServer
from tests.integration.proj import close_app, make_app

pytestmark = pytest.mark.redis

PASSWORD = "s3cret-funnel-pass"


@pytest.fixture
def protected() -> Iterator[RedisServer]:
    """A Redis that asks for a password (the funnels' and the broker's)."""
    with RedisServer() as server:
        with redis.Redis(port=server.port) as client:
            client.config_set("requirepass", PASSWORD)  # once up: its start pings without
        yield server


def confs(app: Any) -> list[dict[str, Any]]:
    """Every worker's ``inspect conf`` reply, from an in-process worker of ``app``;
    the app is closed after."""
    try:
        with start_worker(app, pool="solo", perform_ping_check=False):
            replies = app.control.inspect(timeout=5).conf() or {}
    finally:
        close_app(app)
    assert replies, "the worker answered"
    for conf in replies.values():
        assert PASSWORD not in str(conf), conf
    return list(replies.values())


def test_inspect_conf_masks_the_funnels_password(protected: RedisServer) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{protected.port}/0"
    app = make_app(
        url, url, funnel_redis_options={"password": PASSWORD}, worker_enable_remote_control=True
    )
    for conf in confs(app):
        assert conf["funnel_redis_url"] == f"redis://:****@127.0.0.1:{protected.port}/0"
        assert conf["funnel_redis_options"]["password"] == "********"  # Celery's own mask


def test_inspect_conf_masks_a_password_given_in_the_urls_query(protected: RedisServer) -> None:
    """The URL's ``?password=`` form, with a user name: masked as well."""
    url = f"redis://default@127.0.0.1:{protected.port}/0?password={PASSWORD}"
    broker = f"redis://:{PASSWORD}@127.0.0.1:{protected.port}/0"
    app = make_app(broker, url, store_url=broker, worker_enable_remote_control=True)
    for conf in confs(app):
        assert conf["funnel_redis_url"].endswith("?password=****"), conf["funnel_redis_url"]
