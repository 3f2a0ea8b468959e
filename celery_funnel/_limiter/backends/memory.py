"""``MemoryFunnel``: the Python twins of the Lua scripts, in one process."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..errors import ConfigurationError
from ..keys import ranks_key, tickets_key
from ..memstore import Clock, MemoryStore
from ..scripts import Arg, Reply, Script
from .base import Funnel


class MemoryFunnel(Funnel):
    """Funnels kept in this process, with the same maths as ``RedisFunnel``.

    For tests, single-process programs and replays. ``clock`` returns float seconds
    since the epoch (default ``time.time``); ``now=`` on a call overrides it.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.store = MemoryStore(clock)
        # Each twin runs whole under the lock, as a script does in Redis.
        self._lock = threading.Lock()

    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        if script.twin is None:
            raise ConfigurationError(f"{script.name}.lua runs on Redis only")
        with self._lock:
            return script.twin(self.store, keys, args)

    def reset(self, key: str) -> None:
        with self._lock:
            self.store.delete(key, tickets_key(key), ranks_key(key))
