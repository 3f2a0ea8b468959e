"""The funnels' Redis password never shows where Celery shows a worker's configuration:
``celery inspect conf`` (what Flower's Config tab reads), from a real worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_funnel import install
from celery_funnel._config.runtime import runtime_for
from celery_funnel.testing import RedisServer
from tests.integration.proj import close_app, make_app
from tests.polling import wait_for

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
    replies: dict[str, Any] = {}

    def answered() -> bool:
        replies.update(app.control.inspect(timeout=1).conf() or {})
        return bool(replies)

    try:
        with start_worker(app, pool="solo", perform_ping_check=False):
            # a hang detector: a loaded CI machine's worker did not answer within 5 s
            wait_for(answered, 120)
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


def test_inspect_conf_masks_a_django_namespaced_url(protected: RedisServer) -> None:
    """A Django project's settings (``config_from_object(..., namespace="CELERY")``):
    the funnels' URL is ``CELERY_FUNNEL_REDIS_URL``, which Celery keeps under that
    name (it maps only its own settings): masked as well, and so is the broker's
    ``CELERY_BROKER_URL``, which Celery 5.7 shows as it is (it masks ``broker_url``)."""
    url = f"redis://:{PASSWORD}@127.0.0.1:{protected.port}/0"
    conf = namespaced_conf(url, url)
    assert conf["CELERY_FUNNEL_REDIS_URL"] == f"redis://:****@127.0.0.1:{protected.port}/0"
    assert conf["CELERY_BROKER_URL"] == f"redis://:****@127.0.0.1:{protected.port}/0"
    assert conf["CELERY_RESULT_BACKEND"] == f"redis://:********@127.0.0.1:{protected.port}/0"


def namespaced_conf(broker_url: str, url: str) -> dict[str, Any]:
    """The ``inspect conf`` reply of a worker configured as a Django project is."""

    class Settings:  # django.conf.settings
        CELERY_BROKER_URL = broker_url
        CELERY_RESULT_BACKEND = url
        CELERY_FUNNEL_REDIS_URL = url
        CELERY_WORKER_ENABLE_REMOTE_CONTROL = True
        CELERY_WORKER_HIJACK_ROOT_LOGGER = False
        CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

    app = Celery("django_project", set_as_current=False)
    app.config_from_object(Settings, namespace="CELERY")
    install(app)
    assert runtime_for(app).settings.redis_url == url  # the funnels' Redis is this one
    (conf,) = confs(app)
    assert "funnel_redis_url" not in conf  # shown under the name it was given
    return conf
