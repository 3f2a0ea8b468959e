"""kombu's Redis channel with the fetch (``fetch``) in place of its BRPOP, and markers
to wake on.

kombu's consumer sends BRPOP over its queue lists and records a message as un-acked
(``QoS.append``: ZADD ``unacked_index`` + HSET ``unacked``) only once it has read and
decoded it: a worker killed, a broker dying or a connection breaking in between loses
the message. Here the poll connection sends the fetch instead, which takes and records
in one call, so until it is acked a message is always in a list or in ``unacked``.

Lua cannot block, so a consumer waits on *markers*: each queue has a marker list
(``wake_key``), to which this transport's publishes and restores push one "1" per
message, and which the fetch pops one of per message taken (and clears when the queue
is empty). A consumer whose last fetch found nothing blocks with BRPOP on its queues'
markers (popping a marker takes no message): woken by one, or after
``brpop_timeout`` (1 s) for messages of producers that push none (stock kombu), it
fetches again; while fetches find messages it fetches without waiting.

Every key but the markers is kombu's, written as kombu writes it: stock producers,
stock workers and kombu's own ack, reject and restore work beside this transport.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from time import monotonic
from typing import Any

import redis as redis_py
from kombu.exceptions import KombuError
from kombu.transport import redis, virtual
from kombu.utils.json import dumps
from redis.exceptions import NoScriptError, ResponseError

from .fetch import Fetch, Taken

__all__ = ["Channel", "QoS", "SentinelChannel"]

logger = logging.getLogger("celery_funnel.transport")

FETCHING, WAKING = "fetch", "wake"  # what the poll connection waits for
CLOSE_READ_SECONDS = 2.0  # how long a closing channel waits for a fetch's reply
MARKERS_KEPT = 1000  # a marker wakes one worker: more than the idle workers is enough


class QoS(redis.QoS):
    """kombu's QoS, which leaves alone a record the fetch has written already."""

    def append(self, message: Any, delivery_tag: str) -> None:
        if self.channel.recorded == delivery_tag:
            virtual.QoS.append(self, message, delivery_tag)
        else:
            super().append(message, delivery_tag)


class Channel(redis.Channel):
    """A kombu Redis channel that takes messages with the fetch (see the module)."""

    QoS = QoS
    #: the wake marker list of a queue (``%s``: the queue's name), beside kombu's keys
    wake_key = "celery_funnel:wake:%s"
    from_transport_options: tuple[str, ...] = (  # type: ignore[assignment]
        *redis.Channel.from_transport_options, "wake_key",
    )  # fmt: skip

    _in_poll: Any = None  # kombu's: the connection a poll command was sent on
    _brpop_sent_at: Any = None  # kombu's: when it was sent (monotonic seconds)
    _polling: str | None = None  # FETCHING or WAKING: the reply the poll connection waits for
    _ready = True  # a fetch may find a message: fetch rather than wait for a marker
    recorded: str | None = None  # the delivery tag being delivered whose record is written

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._no_ack: set[str] = set()
        self.fetch = Fetch(self)
        super().__init__(*args, **kwargs)

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        (self._no_ack.add if no_ack else self._no_ack.discard)(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def _brpop_start(self, timeout: float | None = None) -> None:
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        if self._ready:
            self._polling, command = FETCHING, self.fetch.command(queues, self._no_ack)
        else:
            wait = getattr(self, "brpop_timeout", 1) if timeout is None else timeout
            markers = [self.fetch.key(self.fetch.marker(queue)) for queue in queues]
            self._polling, command = WAKING, ["BRPOP", *markers, wait or 0]
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        self.client.connection.send_command(*command)

    def _brpop_read(self, **options: Any) -> bool:
        polling, self._polling = self._polling, None
        try:
            reply = self._read(polling, **options)
            if polling == WAKING:
                self._ready = True  # a marker, or the fallback poll for stock producers
                raise virtual.Empty()
            taken = self.fetch.read(reply)
            self._ready = taken is not None
            if taken is None:
                raise virtual.Empty()
            self._queue_cycle.rotate(taken.queue)
            self._hand_over(taken)
            return True
        finally:
            self._in_poll = None
            flush = getattr(self, "_flush_brpop_reauth", None)  # kombu >= 5.7
            if flush is not None:
                flush()

    def _read(self, polling: str | None, **options: Any) -> Any:
        """The poll connection's reply to the command it sent (``polling``).

        Raises:
            Empty: the fetch did not run (NOSCRIPT: EVAL next) or the broker refused
                to record the message (it stays in its queue: wait a marker first).
        """
        connection = self.client.connection
        name = "BRPOP" if polling == WAKING else "EVALSHA"
        try:
            reply = self.client.parse_response(connection, name, **options)
        except self.connection_errors:
            connection.disconnect()  # the next poll connects again, as kombu does
            raise
        except NoScriptError:
            self.fetch.loaded = False
        except ResponseError as refused:
            logger.warning("celery-funnel transport: the broker refused the fetch (%s); "
                           "the message stays in its queue", refused)  # fmt: skip
            self._ready = False
        else:
            if polling == FETCHING:
                self.fetch.loaded = True  # it ran, EVAL or EVALSHA: the server has it
            return reply
        raise virtual.Empty()

    def _hand_over(self, taken: Taken) -> None:
        """Hand ``taken`` to its consumer; QoS.append keeps the fetch's record."""
        self.recorded = taken.tag if taken.recorded else None
        try:
            self.connection._deliver(taken.payload, taken.queue)
        finally:
            self.recorded = None

    def _poll_error(self, type: str, **options: Any) -> None:
        if type == "BRPOP":  # our reply, whichever it is: read it as ours
            self._brpop_read(**options)
        else:
            super()._poll_error(type, **options)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        """Take one message off ``queue`` at once (``Queue.get``), recorded as it is
        taken unless ``no_ack``; None when the queue is empty."""
        with self._plain_client() as client:
            taken = self.fetch.now(client, queue, no_ack)
            expire = getattr(self, "_maybe_update_queues_expire", None)  # kombu >= 5.6
            if expire is not None:
                expire(self._create_client(), queue)
        if taken is None:
            return None
        message = self.Message(taken.payload, channel=self)
        if not no_ack:
            self.recorded = taken.tag if taken.recorded else None
            try:
                self.qos.append(message, message.delivery_tag)
            finally:
                self.recorded = None
        return message

    @contextmanager
    def _plain_client(self) -> Iterator[Any]:
        """A client on the channel's pool that sends keys as given (the fetch prefixes
        them itself)."""
        client = redis_py.Redis(connection_pool=self.pool)
        try:
            yield client
        finally:
            client.close()

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        """Publish ``message`` to ``queue`` as kombu does, and push its marker in the
        same round trip (or the same batch)."""
        batch = kwargs.pop("_publish_batch", None)
        commands = [*self._publish_commands(queue, message), *self._marker_commands(queue)]
        if batch is not None:
            for name, *args in commands:
                batch.add(name, *args)
            return
        with self.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
            for name, *args in commands:
                getattr(pipe, name)(*args)
            pipe.execute()

    def _publish_commands(self, queue: str, message: Any) -> Iterator[tuple[Any, ...]]:
        """kombu's publish of ``message`` to ``queue``: LPUSH to its priority's list, and
        the queue's expiry (``x-expires``, kombu >= 5.6) on every list and its marker."""
        pri = self._get_message_priority(message, reverse=False)
        yield ("lpush", self._q_for_pri(queue, pri), dumps(message))
        expires = (getattr(self, "_expires", None) or {}).get(queue)
        if expires:
            for priority in self.priority_steps:
                yield ("pexpire", self._q_for_pri(queue, priority), expires)
            yield ("pexpire", self.fetch.marker(queue), expires)

    def _marker_commands(self, queue: str) -> Iterator[tuple[Any, ...]]:
        """Push ``queue``'s marker, and keep at most ``MARKERS_KEPT`` (no fetch pops them
        where only kombu's own workers consume the queue)."""
        marker = self.fetch.marker(queue)
        yield ("lpush", marker, 1)
        # kombu's prefixing client leaves LTRIM's key as it is given
        prefixes = "LTRIM" in redis.GlobalKeyPrefixMixin.PREFIXED_SIMPLE_COMMANDS
        yield ("ltrim", marker if prefixes else self.fetch.key(marker), 0, MARKERS_KEPT - 1)

    def _do_restore_message(
        self, payload: Any, exchange: str, routing_key: str, pipe: Any, leftmost: bool = False
    ) -> None:
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        for queue in self._lookup(exchange, routing_key):
            pipe.lpush(self.fetch.marker(queue), 1)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        super()._delete(queue, *args, **kwargs)
        with self.conn_or_acquire() as client:
            client.delete(self.fetch.marker(queue))

    def close(self) -> None:
        """Close as kombu does; a fetch's reply still on its way is read and its message
        restored (it was recorded: left unread it would wait out the visibility
        timeout). A marker's reply is left: it takes no message."""
        if self._in_poll and self._polling == FETCHING:
            self._restore_in_flight()
        self._in_poll = None  # kombu would deliver the reply it reads here
        super().close()

    def _restore_in_flight(self) -> None:
        self._polling = None
        try:
            # a broker gone half-open never answers: the record then waits out the
            # visibility timeout, and the worker stops now
            if not self.client.connection.can_read(timeout=CLOSE_READ_SECONDS):
                return
            taken = self.fetch.read(self._read(FETCHING))
        except (virtual.Empty, KombuError, *self.connection_errors):
            return  # nothing taken, or still recorded: restored after the timeout
        if taken is not None and taken.recorded:
            self.qos.restore_by_tag(taken.tag, leftmost=True)


class SentinelChannel(Channel, redis.SentinelChannel):
    """The fetch over Redis Sentinel (``sentinel://`` broker URLs)."""

    from_transport_options: tuple[str, ...] = (  # type: ignore[assignment]
        *redis.SentinelChannel.from_transport_options, "wake_key",
    )  # fmt: skip
