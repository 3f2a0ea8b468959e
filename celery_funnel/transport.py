"""A kombu transport for a Redis broker that loses no message between taking it off its
queue and recording it as un-acked.

Turn it on with one setting, the broker URL unchanged::

    app.conf.broker_transport = "celery_funnel.transport:Transport"
    # a sentinel:// broker URL: "celery_funnel.transport:SentinelTransport"

kombu's Redis transport takes a message with BRPOP and records it as un-acked a round
trip later: a worker killed, a broker dying or a connection breaking in between loses
it, in plain Celery too. This transport takes and records in one atomic script call
(the *fetch*), in kombu's own keys and layout, so stock producers and workers, and
kombu's own ack, reject and restore, work beside it; removing the setting turns it off.
See docs/operations.md ("The broker transport").
"""

from __future__ import annotations

from kombu.transport import redis

from ._transport.channel import Channel, SentinelChannel

__all__ = ["SentinelTransport", "Transport"]


class Transport(redis.Transport):
    """kombu's Redis transport with the atomic fetch (``redis://``, ``rediss://``,
    ``redis+socket://`` broker URLs)."""

    Channel = Channel
    #: the gate reads this: a message taken is never only in a worker's memory
    fetch_records = True


class SentinelTransport(redis.SentinelTransport):
    """kombu's Redis Sentinel transport with the atomic fetch (``sentinel://``)."""

    Channel = SentinelChannel
    fetch_records = True
