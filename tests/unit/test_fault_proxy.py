"""The fault matrix's TCP proxy: a cut hangs connections old and new (it refuses
nothing), a heal delivers what was held (or resets, when asked), and close() ends its
threads."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.faults.proxy import Proxy

WAIT = 0.3  # seconds a read waits to tell a hung connection from a working one


@pytest.fixture
def echo() -> Iterator[int]:
    """A server on loopback that sends back what it reads, and counts the bytes."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = server.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def connect(proxy: Proxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT)


def test_a_cut_hangs_old_and_new_connections_and_a_heal_delivers_what_was_held(
    echo: int,
) -> None:
    with Proxy(echo) as proxy, connect(proxy) as old:
        old.sendall(b"a")
        assert old.recv(10) == b"a"
        proxy.cut()
        old.sendall(b"b")
        with pytest.raises(TimeoutError):
            old.recv(10)
        with connect(proxy) as new:  # accepted: a partition refuses nothing
            new.sendall(b"c")
            with pytest.raises(TimeoutError):
                new.recv(10)
            proxy.heal()
            old.settimeout(5)
            new.settimeout(5)
            assert old.recv(10) == b"b"
            assert new.recv(10) == b"c"


def test_a_connection_given_up_during_the_cut_is_never_delivered(echo: int) -> None:
    with Proxy(echo) as proxy:
        proxy.cut()
        with connect(proxy) as gone:
            gone.sendall(b"x")
        proxy.heal()
        with connect(proxy) as fresh:
            fresh.settimeout(5)
            fresh.sendall(b"y")
            assert fresh.recv(10) == b"y"


def test_a_heal_in_reset_mode_resets_the_connections_that_lived_through_the_cut(
    echo: int,
) -> None:
    with Proxy(echo, on_heal="reset") as proxy, connect(proxy) as old:
        # a round trip first: the proxy has taken the connection in before the cut (a
        # connection its accept thread had not reached would simply be forwarded at heal)
        old.sendall(b"a")
        assert old.recv(10) == b"a"
        proxy.cut()
        old.sendall(b"b")
        proxy.heal()
        old.settimeout(5)
        with pytest.raises(ConnectionResetError):
            old.recv(10)  # a reset, not an orderly end
        with connect(proxy) as fresh:
            fresh.settimeout(5)
            fresh.sendall(b"z")
            assert fresh.recv(10) == b"z"


def test_close_ends_every_thread_of_the_proxy(echo: int) -> None:
    before = set(threading.enumerate())
    with Proxy(echo) as proxy, connect(proxy) as client:
        client.sendall(b"a")
        assert client.recv(10) == b"a"
        proxy.cut()
    assert set(threading.enumerate()) <= before
