"""redis-py clients from ``funnel_redis_url``: standalone, Redis Cluster or Sentinel.

- ``redis://``, ``rediss://``, ``unix://``: one server (``redis.Redis.from_url``);
- ``redis+cluster://host:port[,host:port...]`` (and ``rediss+cluster://``): a Redis
  Cluster, discovered from the nodes given (``redis.cluster.RedisCluster``);
- ``redis+sentinel://[:password@]host:port[,host:port...]/service[/db]``: the master
  of ``service`` as the Sentinels at those addresses name it, followed across failovers
  (``redis.sentinel.Sentinel.master_for``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from ..errors import ConfigurationError

__all__ = ["client_from_url", "mask_url"]

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


def _cluster(url: str, options: dict[str, Any]) -> RedisCluster:
    scheme, _, rest = url.partition("://")
    user, password, hosts = _split_auth(rest.split("/", 1)[0])
    # redis-py leaves ClusterNode, Sentinel and master_for untyped
    nodes = [ClusterNode(host, port) for host, port in _addresses(url, hosts)]  # type: ignore[no-untyped-call]
    return RedisCluster(
        startup_nodes=nodes, username=user, password=password,
        ssl=scheme.startswith("rediss"), **options,
    )  # fmt: skip


def _sentinel(url: str, options: dict[str, Any]) -> Any:
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
    sentinel = Sentinel(_addresses(url, hosts), sentinel_kwargs=timeouts, **timeouts)  # type: ignore[no-untyped-call]
    rest_options = {k: v for k, v in options.items() if k not in timeouts}
    return sentinel.master_for(  # type: ignore[no-untyped-call]
        service, db=db, username=user, password=password, **timeouts, **rest_options
    )


def client_from_url(url: str, **options: Any) -> Any:
    """A redis-py client for ``url``; ``options`` (timeouts, say) go to the client.

    Raises:
        ConfigurationError: when the URL cannot be understood, naming it.
    """
    try:
        if url.startswith(CLUSTER_SCHEMES):
            return _cluster(url, options)
        if url.startswith(SENTINEL_SCHEME):
            return _sentinel(url, options)
        return redis.Redis.from_url(url, **options)
    except (ValueError, redis.RedisError) as exc:
        raise ConfigurationError(f"invalid funnel_redis_url {mask_url(url)!r}: {exc}") from None
