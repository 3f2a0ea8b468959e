"""The fetch: one call of ``lua/fetch.lua`` that takes a message off the first non-empty
queue list, in kombu's order, and writes its un-acked record in the same call.

``Fetch`` knows a channel's keys (its ``global_keyprefix`` added by hand: kombu's
prefixing client prefixes only an EVALSHA's first key) and builds the command, sent on
the consumer's poll connection (``command``) or run at once (``now``, for
``basic_get``); ``read`` turns a reply into what was taken.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from time import time
from typing import Any

from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from redis.exceptions import NoScriptError

from .._limiter.scripts import Script

__all__ = ["FETCH", "Fetch", "Taken"]

FETCH = Script.load("fetch", prelude=())


@dataclass(frozen=True)
class Taken:
    """A message the fetch took: its ``queue``, the decoded ``payload``, and whether the
    fetch wrote its un-acked record (``recorded``; False: a no-ack consumer's, or a
    message the script could not read, which the consumer records as kombu does)."""

    queue: str
    payload: dict[str, Any]
    recorded: bool

    @property
    def tag(self) -> str:
        """The message's delivery tag."""
        return str(self.payload["properties"]["delivery_tag"])


class Fetch:
    """The fetch of one kombu Redis channel (``channel``: its keys, priority steps and
    prefix are read from it when a command is built, as kombu reads them)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.loaded = False  # EVAL once (it loads the script), then EVALSHA until NOSCRIPT
        self._lists: list[str] = []  # the queue of each list of the command in flight

    def key(self, name: str) -> str:
        """Key ``name`` as the server knows it: with the channel's global key prefix."""
        return f"{self.channel.global_keyprefix}{name}"

    def marker(self, queue: str) -> str:
        """The wake marker list of ``queue``, unprefixed (kombu's client prefixes it)."""
        return str(self.channel.wake_key % queue)

    def command(self, queues: Sequence[str], no_ack: Collection[str]) -> list[Any]:
        """The fetch's command over ``queues`` in their order, every priority step of
        each (kombu's BRPOP order); ``no_ack``: queues whose messages are not recorded.
        EVAL with the source where the server lost the script (``loaded`` False)."""
        channel = self.channel
        lists = [(queue, channel._q_for_pri(queue, pri)) for pri in channel.priority_steps
                 for queue in queues]  # fmt: skip
        self._lists = [queue for queue, _ in lists]
        markers = {queue: number for number, queue in enumerate(dict.fromkeys(queues), 1)}
        keys = [
            self.key(channel.unacked_key), self.key(channel.unacked_index_key),
            *(self.key(name) for _, name in lists),
            *(self.key(self.marker(queue)) for queue in markers),
        ]  # fmt: skip
        records = channel.ack_emulation
        flags = ["1" if records and queue not in no_ack else "0" for queue, _ in lists]
        which = [markers[queue] for queue, _ in lists]
        script = ["EVALSHA", FETCH.sha] if self.loaded else ["EVAL", FETCH.source]
        return [*script, len(keys), *keys, repr(time()), len(lists), *flags, *which]

    def read(self, reply: Any) -> Taken | None:
        """What the reply of the last ``command`` took (None: every list was empty)."""
        if not reply:
            return None
        index, item, recorded = reply
        payload = loads(bytes_to_str(item))
        return Taken(self._lists[int(index) - 1], payload, bool(int(recorded)))

    def now(self, client: Any, queue: str, no_ack: bool) -> Taken | None:
        """Fetch from ``queue`` at once on redis-py ``client`` (one that does not prefix
        keys itself), loading the script where the server lost it (NOSCRIPT: the call
        did not run, so running it again takes nothing twice).

        Raises:
            RedisError: when the broker fails or refuses to record the message.
        """
        command = self.command([queue], [queue] if no_ack else [])
        try:
            reply = client.execute_command(*command)
        except NoScriptError:
            client.script_load(FETCH.source)
            reply = client.execute_command(*command)
        return self.read(reply)
