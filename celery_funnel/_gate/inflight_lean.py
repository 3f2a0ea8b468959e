"""A lean way to a connection the worker gate keeps for itself
(``_gate.inflight_connection``): calls packed by redis-py's own packer and written in one
system call, replies read with one read per wake-up of the event loop and parsed by
hiredis.

redis-py's connection, for the same reply, polls the socket (``can_read``), then reads
it through its parser's buffer: two system calls and their Python per reply, about 8 us
of the 12 us it takes to read one on the 2-core machine of ``bench/``. In a worker that
is 7 000 to 21 000 fewer instructions per task (0.2-0.6 %), too little to see in time.
The connection is still redis-py's: it connects, authenticates, selects the database and
disconnects; the lean path is taken only where it reads exactly what redis-py would:
hiredis installed, plain TCP or Unix socket (not TLS), RESP2 or (hiredis 3+) RESP3.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError

try:  # an optional dependency (celery-funnel[hiredis])
    import hiredis

    HIREDIS = True
except ImportError:  # pragma: no cover - the tests install it
    HIREDIS = False

try:  # maps "NOSCRIPT ..." to NoScriptError, as redis-py's replies do
    from redis._parsers.base import BaseParser

    _parse_error: Any = BaseParser.parse_error
except (ImportError, AttributeError):  # pragma: no cover - another redis-py layout
    _parse_error = ResponseError

__all__ = ["Lean", "lean"]

READ_BYTES = 65536  # what one wake-up reads at most; the rest wakes the loop again


class Lean:
    """``connection``'s socket, written and read directly (see the module)."""

    def __init__(self, connection: Any) -> None:
        self.sock: socket.socket = connection._sock
        self.fd = self.sock.fileno()
        self.pack = connection.pack_command
        encoder = connection.encoder
        options: dict[str, Any] = {
            "protocolError": InvalidResponse,
            "replyError": _parse_error,
            "errors": encoder.encoding_errors,
        }
        if encoder.decode_responses:
            options["encoding"] = encoder.encoding
        self.reader = hiredis.Reader(**options)

    def send(self, *args: Any) -> None:
        """Send one command.

        Raises:
            OSError: when the socket fails.
        """
        self.sock.sendall(b"".join(self.pack(*args)))

    def replies(self) -> list[Any]:
        """Every reply complete in what one read gets (none on a wake-up with nothing
        to read); an error reply is its exception, returned, as redis-py raises it.

        Raises:
            redis.exceptions.ConnectionError: the server closed the connection.
            OSError, InvalidResponse: when the socket or the protocol fails.
        """
        try:
            data = os.read(self.fd, READ_BYTES)
        except BlockingIOError:  # the socket has a timeout, so it does not block
            return []
        if not data:
            raise RedisConnectionError("the funnels' Redis closed the connection")
        self.reader.feed(data)
        replies = []
        while (reply := self.reader.gets()) is not False:
            replies.append(reply)
        return replies


def lean(connection: Any) -> Lean | None:
    """The lean way to ``connection`` (connected), or None where redis-py's own reads
    must stay: no hiredis, TLS (the socket carries ciphertext), RESP3 on a hiredis that
    does not parse it, a socket that blocks (a wake-up with nothing to read would stall
    the event loop)."""
    sock = getattr(connection, "_sock", None)
    if not HIREDIS or type(sock) is not socket.socket:  # ssl.SSLSocket is a subclass
        return None
    protocol = str(getattr(connection, "protocol", 2) or 2)
    if protocol not in ("2", "3") or sock.gettimeout() is None:
        return None
    if protocol == "3" and not hasattr(hiredis, "PushNotification"):  # hiredis < 3
        return None
    return Lean(connection)
