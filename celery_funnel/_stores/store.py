"""What the stores of the funnels' Redis share (parked tasks ``park``, concurrency
funnels' seats ``concurrency``, fair-share queues ``fair``, the backlog): scripts loaded
once from the package's Lua files by the one loader (``_limiter.scripts``), and every
script or command run with a Redis failure raised as ``BackendError`` naming the
store."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from .._limiter.errors import BackendError
from .._limiter.keys import parked_keys
from .._limiter.scripts import RedisClient, Script, run_script

__all__ = ["RedisStore", "script_of", "text"]


def text(value: Any) -> str:
    """A reply item as text (redis-py gives bytes unless it decodes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


@functools.cache
def script_of(*names: str) -> Script:
    """The script of the last of ``names``, after the others (its preludes): loaded once
    per process."""
    return Script.load(names[-1], prelude=names[:-1])


class RedisStore:
    """A store on ``client`` (redis-py); ``what`` names it in errors."""

    what = "the funnels"

    def __init__(self, client: RedisClient) -> None:
        self.client = client

    def _register(self, *names: str) -> Script:
        """The script made of ``celery_funnel/lua/<name>.lua`` files, preludes first."""
        return script_of(*names)

    def _script(self, script: Script, keys: Sequence[str], *args: Any) -> list[Any]:
        try:
            reply = run_script(self.client, script, keys, args)
        except RedisError as exc:
            raise BackendError(f"Redis failed on {self.what}: {exc}") from exc
        return reply if isinstance(reply, list) else [reply]

    def _method(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The client's method ``name`` called with ``args``/``kwargs``."""
        try:
            return getattr(self.client, name)(*args, **kwargs)
        except RedisError as exc:
            raise BackendError(f"Redis failed on {self.what}: {exc}") from exc


class ParkedStore(RedisStore):
    """A store beside the parked tasks: their keys (``parked_keys(prefix)``, one hash
    tag), and scripts that start with the prelude ``lua/_parked.lua`` (``parked_script``)."""

    def __init__(self, client: RedisClient, prefix: str) -> None:
        super().__init__(client)
        self.prefix = prefix
        self.keys = parked_keys(prefix)

    def parked_script(self, name: str) -> Script:
        """``lua/<name>.lua`` after the prelude ``lua/_parked.lua``."""
        return self._register("_parked", name)
