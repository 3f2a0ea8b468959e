"""How long a run published again may wait (its countdown), derived from the broker.

An ETA message sits un-acked in a worker until it runs: past the Redis transport's
``visibility_timeout`` it is delivered again (and runs twice); past RabbitMQ's
``consumer_timeout`` the channel is closed. Quorum queues' native delayed delivery
truncates countdowns to whole seconds and refuses 0 < countdown < 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

REDIS_VISIBILITY_TIMEOUT = 3600.0  # kombu's default
RABBITMQ_CONSUMER_TIMEOUT = 1800.0  # RabbitMQ's default
SAFETY = 0.5  # use at most half of the broker's limit


@dataclass(frozen=True)
class CountdownPolicy:
    """``cap``: the longest countdown to publish (longer waits are published again at the
    cap and check again); ``whole_seconds``: the broker delays by whole seconds only (quorum
    queues), so countdowns are rounded down and the last second is waited in place;
    ``limit``: how long the broker lets a worker keep a message un-acked (seconds:
    the Redis transport's ``visibility_timeout``, RabbitMQ's ``consumer_timeout``),
    whatever the cap (``_shared.delivery`` counts a delivery's deadlines from it)."""

    cap: float
    whole_seconds: bool = False
    limit: float = REDIS_VISIBILITY_TIMEOUT

    def countdown(self, delay: float) -> float:
        """The countdown to publish for a wait of ``delay`` seconds (whole seconds >= 1
        rounded down, when the broker needs them: the task arrives early, never late)."""
        countdown = min(max(delay, 0.0), self.cap)
        if self.whole_seconds:
            return float(max(1, math.floor(countdown)))
        return countdown

    def waits_in_place(self, delay: float) -> bool:
        """Whether ``delay`` is too short to publish (under one second on a broker that
        delays by whole seconds): the task then waits in place, at most one second."""
        return self.whole_seconds and delay < 1.0


def _uses_quorum_queues(conf: Any) -> bool:
    if conf.get("task_default_queue_type") == "quorum":
        return True
    for queue in conf.get("task_queues") or ():
        arguments = getattr(queue, "queue_arguments", None) or {}
        if arguments.get("x-queue-type") == "quorum":
            return True
    return False


def policy_for(conf: Any, max_countdown: float | None) -> CountdownPolicy:
    """The policy for an app's broker; ``max_countdown`` (funnel_max_countdown) wins."""
    url = str(conf.get("broker_url") or conf.get("BROKER_URL") or "")
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower()
    options = conf.get("broker_transport_options") or {}
    quorum = False
    if scheme in ("redis", "rediss", "sentinel", "sqs"):
        limit = float(options.get("visibility_timeout", REDIS_VISIBILITY_TIMEOUT))
    elif scheme in ("amqp", "amqps", "pyamqp", "librabbitmq"):
        limit = float(options.get("consumer_timeout", RABBITMQ_CONSUMER_TIMEOUT))
        quorum = _uses_quorum_queues(conf)
    else:
        limit = REDIS_VISIBILITY_TIMEOUT
    cap = max_countdown if max_countdown is not None else limit * SAFETY
    return CountdownPolicy(cap=cap, whole_seconds=quorum, limit=limit)
