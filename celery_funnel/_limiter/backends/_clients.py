"""redis-py clients from ``funnel_redis_url``: standalone, Redis Cluster or Sentinel.

- ``redis://``, ``rediss://``, ``unix://``: one server (``redis.Redis.from_url``);
- ``redis+cluster://host:port[,host:port...]`` (and ``rediss+cluster://``): a Redis
  Cluster, discovered from the nodes given (``redis.cluster.RedisCluster``);
- ``redis+sentinel://[:password@]host:port[,host:port...]/service[/db]``: the master
  of ``service`` as the Sentinels at those addresses name it, followed across failovers
  (``redis.sentinel.Sentinel.master_for``).

Retries: a call that timed out is never sent again (redis-py 8 retries ten times by
default: a Redis that hangs would hold each call for ten socket timeouts, and a script
that timed out may have run already); a connection refused or reset is tried once more,
on a new connection. ``funnel_redis_options={"retry": ...}`` sets another policy.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple
from urllib.parse import unquote

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.backoff
import redis.cluster
import redis.retry
import redis.sentinel

from ..errors import ConfigurationError

__all__ = ["async_client_from_url", "client_from_url", "mask_url"]


class _Flavour(NamedTuple):
    """redis-py's client classes of one kind: blocking, or ``redis.asyncio``'s."""

    redis: Any
    cluster: Any
    node: Any
    sentinel: Any
    retry: Any


_BLOCKING = _Flavour(
    redis.Redis, redis.cluster.RedisCluster, redis.cluster.ClusterNode, redis.sentinel.Sentinel,
    redis.retry.Retry,
)  # fmt: skip
_ASYNCIO = _Flavour(
    redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster, redis.asyncio.cluster.ClusterNode,
    redis.asyncio.sentinel.Sentinel, redis.asyncio.retry.Retry,
)  # fmt: skip


def _retry(flavour: _Flavour) -> Any:
    """Once more after a connection refused or reset; never after a timeout."""
    return flavour.retry(
        redis.backoff.NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)
    )


CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SENTINEL_SCHEME = "redis+sentinel://"


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/]*):[^@/]*@")
_QUERY_SECRET = re.compile(r"(?P<name>[?&](?:password|sentinel_password)=)[^&#]*", re.I)


def mask_url(url: object) -> str:
    """``url`` fit to print or log: the password of its user info (``:secret@``) and
    ``password=`` query parameters become ``****``; anything not a string is shown by
    its type only (a client object's repr may hold its connection settings)."""
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    url = _USERINFO.sub(r"\g<scheme>\g<user>:****@", url)
    return _QUERY_SECRET.sub(r"\g<name>****", url)


def _addresses(where: str, hosts: str) -> list[tuple[str, int]]:
    addresses = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(f"{mask_url(where)}: expected host:port, got {item!r}")
        addresses.append((host.strip("[]"), int(port)))
    return addresses


def _split_auth(netloc: str) -> tuple[str | None, str | None, str]:
    if "@" not in netloc:
        return None, None, netloc
    auth, _, hosts = netloc.rpartition("@")
    user, _, password = auth.partition(":")
    return (unquote(user) or None), (unquote(password) or None), hosts


def _cluster(url: str, options: dict[str, Any], flavour: _Flavour) -> Any:
    scheme, _, rest = url.partition("://")
    user, password, hosts = _split_auth(rest.split("/", 1)[0])
    nodes = [flavour.node(host, port) for host, port in _addresses(url, hosts)]
    return flavour.cluster(
        startup_nodes=nodes, username=user, password=password,
        ssl=scheme.startswith("rediss"), **options,
    )  # fmt: skip


def _sentinel(url: str, options: dict[str, Any], flavour: _Flavour) -> Any:
    rest = url[len(SENTINEL_SCHEME) :]
    netloc, _, path = rest.partition("/")
    user, password, hosts = _split_auth(netloc)
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ConfigurationError(
            f"funnel_redis_url {mask_url(url)!r}: expected"
            f" redis+sentinel://host:port[,...]/service[/db]"
        )
    service, db = parts[0], int(parts[1]) if len(parts) == 2 else 0
    timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel = flavour.sentinel(_addresses(url, hosts), sentinel_kwargs=timeouts, **timeouts)
    rest_options = {k: v for k, v in options.items() if k not in timeouts}
    return sentinel.master_for(
        service, db=db, username=user, password=password, **timeouts, **rest_options
    )


def client_from_url(url: str, **options: Any) -> Any:
    """A redis-py client for ``url``; ``options`` (timeouts, say) go to the client.

    Raises:
        ConfigurationError: when the URL cannot be understood, naming it.
    """
    return _client(url, options, _BLOCKING)


def async_client_from_url(url: str, **options: Any) -> Any:
    """A ``redis.asyncio`` client for ``url``, read as ``client_from_url`` reads it.

    Raises:
        ConfigurationError: when the URL cannot be understood, naming it.
    """
    return _client(url, options, _ASYNCIO)


def _client(url: str, options: dict[str, Any], flavour: _Flavour) -> Any:
    options = {"retry": _retry(flavour), **options}
    try:
        if url.startswith(CLUSTER_SCHEMES):
            return _cluster(url, options, flavour)
        if url.startswith(SENTINEL_SCHEME):
            return _sentinel(url, options, flavour)
        return flavour.redis.from_url(url, **options)
    except (ValueError, redis.RedisError) as exc:
        raise ConfigurationError(f"invalid funnel_redis_url {mask_url(url)!r}: {exc}") from None
