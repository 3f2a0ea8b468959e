"""What the stores of the funnels' Redis share (parked tasks ``_park``, concurrency slots
``_leases``, fair-share queues ``_fair_store``): scripts registered once from the package's
Lua files, and every script or command run with a Redis failure raised as ``BackendError``
naming the store."""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from .._limiter.errors import BackendError
from .._limiter.scripts import _read

__all__ = ["RedisStore", "text"]


def text(value: Any) -> str:
    """A reply item as text (redis-py gives bytes unless it decodes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisStore:
    """A store on ``client`` (redis-py); ``what`` names it in errors."""

    what = "the funnels"

    def __init__(self, client: Any) -> None:
        self.client = client

    def _register(self, *names: str) -> Any:
        """The script made of ``celery_funnel/lua/<name>.lua`` files, preludes first."""
        return self.client.register_script("".join(_read(name) for name in names))

    def _script(self, script: Any, keys: list[str], *args: Any) -> list[Any]:
        try:
            reply = script(keys=keys, args=list(args))
        except RedisError as exc:
            raise BackendError(f"Redis failed on {self.what}: {exc}") from exc
        return reply if isinstance(reply, list) else [reply]

    def _method(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The client's method ``name`` called with ``args``/``kwargs``."""
        try:
            return getattr(self.client, name)(*args, **kwargs)
        except RedisError as exc:
            raise BackendError(f"Redis failed on {self.what}: {exc}") from exc
