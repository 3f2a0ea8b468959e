"""``funnel_redis_url`` forms: what each becomes, and clear errors for the malformed."""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

from celery_funnel import ConfigurationError, RedisFunnel
from celery_funnel.backends._clients import client_from_url


def test_plain_urls_give_a_redis_client_with_the_timeouts() -> None:
    client = client_from_url("redis://127.0.0.1:1/3", socket_timeout=0.5)
    assert isinstance(client, redis.Redis)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["port"], kwargs["db"], kwargs["socket_timeout"]) == (1, 3, 0.5)
    client.close()


def test_sentinel_url_names_service_db_password_and_every_sentinel() -> None:
    client = client_from_url(
        "redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380/funnels/2", socket_timeout=0.5
    )
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)  # nothing connects until first use
    assert pool.service_name == "funnels"
    assert pool.connection_kwargs["db"] == 2
    assert pool.connection_kwargs["password"] == "s3cret"
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26379, 26380]
    client.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://127.0.0.1:26379", "service"),
        ("redis+sentinel://127.0.0.1:26379/a/b/c", "service"),
        ("redis+sentinel://127.0.0.1:26379/funnels/x", "service"),
        ("redis+sentinel://127.0.0.1/funnels", "host:port"),
        ("redis+cluster://nohost", "host:port"),
        ("redis+cluster://127.0.0.1:x", "host:port"),
        ("nosuch://127.0.0.1", "nosuch"),
    ],
)
def test_malformed_urls_are_configuration_errors_naming_the_url(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        RedisFunnel.from_url(url)
    assert url in str(raised.value)
