"""``funnel_redis_url`` forms: what each becomes, and clear errors for the malformed."""

from __future__ import annotations

import pickle

import pytest
import redis
from celery import Celery
from redis import exceptions as rx
from redis.sentinel import SentinelConnectionPool

from celery_funnel import BackendError, ConfigurationError, RedisFunnel
from celery_funnel._config.outage import configuration_fault
from celery_funnel._config.runtime import Runtime
from celery_funnel._limiter.backends._clients import client_from_url, mask_url
from celery_funnel._limiter.backends.redis import failure
from celery_funnel._limiter.errors import BackendConfigurationError


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


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@h:1/0", "redis://:****@h:1/0"),
        ("rediss://user:p%40ss@h/0", "rediss://user:****@h/0"),
        ("redis+sentinel://:s3cret@a:1,b:2/svc", "redis+sentinel://:****@a:1,b:2/svc"),
        ("redis+cluster://u:s3cret@a:1,b:2", "redis+cluster://u:****@a:1,b:2"),
        ("unix:///tmp/r.sock?db=1&password=s3cret", "unix:///tmp/r.sock?db=1&password=****"),
        ("redis://h:1/0", "redis://h:1/0"),
    ],
)
def test_passwords_are_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_a_bad_url_error_does_not_show_the_password() -> None:
    with pytest.raises(ConfigurationError) as err:
        client_from_url("redis+sentinel://:s3cret@h:1/")
    assert "s3cret" not in str(err.value)
    assert ":****@" in str(err.value)


def test_funnel_redis_options_reach_the_client() -> None:
    app = Celery("options", set_as_current=False)
    app.conf.funnel_redis_url = "rediss://127.0.0.1:1/0"
    app.conf.funnel_redis_options = {"ssl_ca_certs": "/ca.pem", "socket_timeout": 7.0}
    funnel = Runtime(app).funnel
    kwargs = funnel.client.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    assert (kwargs["ssl_ca_certs"], kwargs["socket_timeout"]) == ("/ca.pem", 7.0)
    assert kwargs["socket_connect_timeout"] == 1.0  # funnel_socket_timeout, not overridden
    funnel.client.close()


def test_funnel_redis_options_must_be_a_dict() -> None:
    app = Celery("options", set_as_current=False)
    app.conf.funnel_redis_url = "redis://127.0.0.1:1/0"
    app.conf.funnel_redis_options = [("ssl", True)]
    with pytest.raises(ConfigurationError, match="funnel_redis_options must be a dict"):
        _ = Runtime(app).funnel


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (rx.AuthenticationError("invalid username-password pair"), "credentials"),
        (rx.NoPermissionError("this user has no permissions to access one of the keys"), "ACL"),
        (rx.ResponseError("Error running script: @user_script:1: NOPERM no"), "ACL"),
        (rx.ResponseError("The user executing the script can't run this command"), "ACL"),
        (rx.ReadOnlyError("You can't write against a read only replica."), "replica"),
        (rx.ResponseError("Error running script: -READONLY You can't write"), "replica"),
        (rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"), "memory"),
        (rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"), "type"),
        (rx.ConnectionError("Connection refused"), None),
        (rx.TimeoutError("Timeout reading from socket"), None),
        (rx.BusyLoadingError("Redis is loading the dataset in memory"), None),
        (rx.TryAgainError("TRYAGAIN"), None),
        (rx.ClusterDownError("CLUSTERDOWN The cluster is down"), None),
        (rx.MasterDownError("MASTERDOWN Link with MASTER is down"), None),
    ],
)
def test_configuration_faults_are_told_from_outages(error: Exception, fault: str | None) -> None:
    fix = configuration_fault(error)
    assert (fix is None) == (fault is None)
    if fault is not None:
        assert fix is not None
        assert fault in fix


def test_the_backend_raises_a_configuration_error_that_pickles() -> None:
    error = failure("running gcra.lua", rx.ReadOnlyError("You can't write"))
    assert isinstance(error, BackendConfigurationError)
    assert not isinstance(error, BackendError)  # never backed off as an outage
    assert "point it at the master" in str(error)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
    assert isinstance(failure("x", rx.ConnectionError("refused")), BackendError)
