"""Small things a user of ``celery funnel`` tripped on (issue 55, item 7), through Celery's
own command line on a real Redis:

- ``status`` ended with ``(N other keys under the prefix are not funnels: left alone)``
  for celery-funnel's own keys: the ranks of bookings made with a priority, and the
  windows of debounced keys. Only keys that are not celery-funnel's are counted now.
- ``funnel set NAME --concurrency 4`` on a concurrency funnel printed ``code -``: it
  names the code's concurrency now."""

from __future__ import annotations

import redis

from celery_funnel import RedisFunnel
from celery_funnel._limiter.keys import debounce_key, ranks_key, task_key
from tests.integration.test_cli import celery_funnel, pytestmark

__all__ = ["pytestmark"]
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)


def test_status_counts_only_keys_that_are_not_celery_funnels(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    key = task_key("funnel:", "proj.hourly")  # 1/h: the bookings outlive the command
    funnel = RedisFunnel(redis_client)
    funnel.reserve(key, 0, 1, 3600, ticket="first", rank=3)  # admitted
    funnel.reserve(key, 0, 1, 3600, ticket="second", rank=3)  # booked, with its rank
    funnel.reserve(key, 0, 1, 3600, ticket="third", rank=1)  # takes the second's slot
    assert redis_client.exists(ranks_key(key))
    # a debounced key's window, as the debounce script writes it
    redis_client.set(debounce_key("funnel:", "proj.debounced", "k"), "task-id 1", ex=60)
    redis_client.set("funnel:{another app}", "x")  # and one that is not ours

    done = celery_funnel(redis_url, "status")
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last == (
        "(1 key under the prefix 'funnel:' is not celery-funnel's: not shown, and never reset)"
    ), done.stdout


def test_set_concurrency_names_the_codes_concurrency(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.flushall()
    # proj.seated: funnel_concurrency=2, no rate
    done = celery_funnel(redis_url, "set", "proj.seated", "--concurrency", "4", "--ttl", "1m")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("proj.seated: code concurrency 2; override concurrency 4;")
    # a task with a rate and a concurrency: both
    done = celery_funnel(redis_url, "set", "proj.unique_limited", "--concurrency", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "proj.unique_limited: code 2/s capacity 1, concurrency 1; override concurrency 3;"
    ), done.stdout
    assert celery_funnel(redis_url, "unset", "proj.unique_limited").returncode == 0
    assert celery_funnel(redis_url, "unset", "proj.seated").returncode == 0
