"""A TCP proxy on loopback that can cut the network between its clients and a server.

``cut()`` is a network partition, not a refusal: nothing is forwarded in either
direction, open connections stay open and hang, and new connections are accepted (the
kernel completes the handshake) but hang too. Every client call meets its own timeout.

``heal()`` forwards again. What a healed partition does to the connections is a choice:

- ``on_heal="deliver"`` (the default) is TCP's own view of a partition shorter than its
  retransmission limit (about 15 minutes on Linux): nothing is lost, it is late. The
  bytes each side sent during the cut, and a close (FIN) that followed them, reach the
  other side at heal, in order: a command whose client gave up during the cut still
  reaches the server and runs, late. A connection opened during the cut is connected
  to the server at heal if its client still holds it; one its client closed meanwhile
  is dropped unseen (in a real partition its SYN never arrived), and nothing it sent is
  delivered.
- ``on_heal="reset"`` is a middlebox (NAT, conntrack, a load balancer) that forgot the
  flows: every connection that lived through the cut is reset at heal on both sides,
  and what was held is dropped. Connections opened after heal work.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from typing import Literal

__all__ = ["Proxy"]

_CHUNK = 65536  # bytes per read
_ACCEPT_POLL = 0.2  # seconds: how soon the accept loop notices close()


class _Link:
    """One client connection and, once connected, its server connection."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.server: socket.socket | None = None
        self.dead = False  # reset at heal, or the proxy closed
        self.ended = 0  # directions that reached their end

    def abort(self) -> None:
        """Close both sides at once with a reset (SO_LINGER 0), waking blocked reads."""
        self.dead = True
        for sock in (self.client, self.server):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    # SHUT_RD wakes a thread blocked reading it and sends nothing (SHUT_WR
                    # would send a FIN, an orderly end, before close()'s reset)
                    sock.shutdown(socket.SHUT_RD)
                sock.close()


class Proxy:
    """Forwards 127.0.0.1:``port`` to ``target_host``:``target_port`` until ``cut()``;
    a context manager (started on entry; on exit every connection is closed and the
    proxy's threads end)."""

    def __init__(
        self,
        target_port: int,
        target_host: str = "127.0.0.1",
        *,
        on_heal: Literal["deliver", "reset"] = "deliver",
    ) -> None:
        self.target = (target_host, target_port)
        self.on_heal = on_heal
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_ACCEPT_POLL)
        self.port: int = self._listener.getsockname()[1]
        self._state = threading.Condition()
        self._forwarding = True
        self._closed = False
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._state:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def cut(self) -> None:
        """Stop forwarding, both ways; connections stay open and hang."""
        with self._state:
            self._forwarding = False

    def heal(self) -> None:
        """Forward again (see the module's doc for what happens to held bytes)."""
        with self._state:
            if self.on_heal == "reset":
                for link in list(self._links):
                    link.abort()
                self._links.clear()
            self._forwarding = True
            self._state.notify_all()

    def close(self) -> None:
        """Close every connection and the listener; wait for the threads to end."""
        with self._state:
            self._closed = True
            links, self._links = list(self._links), set()
            self._state.notify_all()
        for link in links:
            link.abort()
        self._listener.close()
        for thread in list(self._threads):
            thread.join(5.0)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _flowing(self, link: _Link) -> bool:
        """Block while the network is cut; False once ``link`` is dead or we closed."""
        with self._state:
            self._state.wait_for(lambda: self._forwarding or self._closed or link.dead)
            return not (self._closed or link.dead)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed
                return
            client.settimeout(None)
            link = _Link(client)
            with self._state:
                if self._closed:
                    client.close()
                    return
                self._links.add(link)
            self._start(self._serve, link)

    def _serve(self, link: _Link) -> None:
        """Connect ``link`` to the server (at heal, if it came during a cut) and pump."""
        with self._state:
            during_cut = not self._forwarding
        if not self._flowing(link):
            return
        held = b""
        if during_cut:
            held, gone = _drain(link.client)
            if gone:  # its client gave up before the network came back
                self._forget(link)
                return
        try:
            link.server = socket.create_connection(self.target, timeout=10)
            link.server.settimeout(None)
            if held:
                link.server.sendall(held)
        except OSError:  # the server is down: the client sees a reset, as it would
            self._forget(link)
            return
        self._start(self._pump, link, link.server, link.client)
        self._pump(link, link.client, link.server)

    def _pump(self, link: _Link, source: socket.socket, sink: socket.socket) -> None:
        """Copy ``source`` to ``sink`` while forwarding; hold what arrives during a cut."""
        while True:
            try:
                data = source.recv(_CHUNK)
            except OSError:  # reset, or aborted by us
                data, reset = b"", True
            else:
                reset = False
            if not self._flowing(link):
                return
            if reset:
                self._forget(link)
                return
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                self._ended(link)
                return
            try:
                sink.sendall(data)
            except OSError:
                self._forget(link)
                return

    def _ended(self, link: _Link) -> None:
        with self._state:
            link.ended += 1
            done = link.ended == 2
        if done:
            self._forget(link, reset=False)

    def _forget(self, link: _Link, *, reset: bool = True) -> None:
        with self._state:
            self._links.discard(link)
        if reset:
            link.abort()
        else:
            link.dead = True
            for sock in (link.client, link.server):
                if sock is not None:
                    sock.close()


def _drain(sock: socket.socket) -> tuple[bytes, bool]:
    """What ``sock`` holds unread, without blocking, and whether its peer closed it."""
    held = b""
    while True:
        try:
            data = sock.recv(_CHUNK, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return held, False
        except OSError:
            return held, True
        if not data:
            return held, True
        held += data
