"""The broker's Redis server, asked only whether it is the funnels' Redis (``INFO
server``: its ``run_id``; ``_stores.persistence``): a task parked in the funnels' Redis
is then exactly as safe as the tasks queued beside it. Nothing is ever written here.

The broker is the app's ``broker_write_url`` (else ``broker_url``; the first of a
failover list): where tasks are published and wait in their queues. kombu's Redis
transport URLs ``redis://``, ``rediss://`` (with ``broker_use_ssl``) and
``redis+socket://`` are read; a ``sentinel://`` broker, or any other transport, is not
the funnels' Redis as far as parking goes (``why``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import redis

__all__ = ["BrokerRedis", "broker_url_of"]

TIMEOUT = 1.0  # seconds: INFO on the broker never holds a wait longer


def broker_url_of(conf: Any) -> str:
    """The URL tasks are published to (``broker_write_url``, else ``broker_url``; the
    first of a failover list); "" when none is set."""
    url: Any = conf.get("broker_write_url") or conf.get("broker_url") or ""
    if isinstance(url, (list, tuple)):
        url = url[0] if url else ""
    return str(url).split(";", 1)[0].strip()


class BrokerRedis:
    """The broker's Redis server for an app's ``conf``, if it is one: ``client()`` is a
    plain redis-py client (made on first call, for INFO only), None when the broker
    is not a Redis server this can ask (``why`` says what it is)."""

    def __init__(self, conf: Any) -> None:
        self.url = broker_url_of(conf)
        scheme = self.url.split("://", 1)[0].lower() if "://" in self.url else self.url
        self.scheme = scheme or "amqp"  # Celery's default broker
        ssl = conf.get("broker_use_ssl")
        self._ssl: dict[str, Any] = dict(ssl) if isinstance(ssl, Mapping) else {}
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def redis(self) -> bool:
        """Whether the broker is a Redis server this can ask."""
        return self.scheme in ("redis", "rediss", "redis+socket")

    @property
    def why(self) -> str:
        """What the broker is, when it is not a Redis server this can ask."""
        if self.scheme == "sentinel":
            return "the broker is behind Redis Sentinel (sentinel://), not compared"
        return "" if self.redis else f"the broker is not Redis ({self.scheme}://)"

    def client(self) -> Any:
        """The redis-py client of the broker's Redis (None: not Redis).

        Raises:
            redis.RedisError, ValueError: a URL redis-py cannot read.
        """
        if not self.redis:
            return None
        with self._lock:
            if self._client is None:
                self._client = self._make()
            return self._client

    def _make(self) -> Any:
        options: dict[str, Any] = {"socket_timeout": TIMEOUT, "socket_connect_timeout": TIMEOUT}
        url = self.url
        if self.scheme == "redis+socket":  # kombu's unix socket: redis+socket:///path
            url = "unix://" + url.split("://", 1)[1]
        elif self.scheme == "rediss":
            options.update(self._ssl)
        return redis.Redis.from_url(url, **options)

    def close(self) -> None:
        """Close the client's connections, if one was made (made again on use)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
