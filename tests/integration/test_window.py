"""A decision in flight is kept out of the consumer's prefetch window (``_gate/window.py``),
on a real worker and real Redis servers: at ``worker_prefetch_multiplier=1`` the worker
fetches the next message while a decision's reply travels, and no more than the bound
(one per pool process); nothing is lost or run twice once the replies come."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis

from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.faults.proxy import Proxy
from tests.integration.proj import close_app, make_app, runs
from tests.integration.test_one_gate import once_each, send
from tests.polling import wait_for

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)
ROOT = str(Path(__file__).resolve().parents[2])
QUEUE = "proj"
UNACKED = "unacked"  # kombu's Redis transport: the messages delivered, not acked yet


def _worker(broker_url: str, funnel_url: str, store_url: str) -> CeleryWorkers:
    """One prefork worker, one process, prefetch multiplier 1; the funnels' socket
    timeout long enough that a reply held back by the proxy is still waited for."""
    env = {
        "FUNNEL_TEST_BROKER": broker_url, "FUNNEL_TEST_REDIS": funnel_url,
        "FUNNEL_TEST_STORE": store_url, "FUNNEL_TEST_RATE": "1000/s",
        "FUNNEL_TEST_CONF": json.dumps({"funnel_socket_timeout": 20}),
    }  # fmt: skip
    options = ("-c", "1", "--prefetch-multiplier", "1", "-Q", QUEUE)
    return CeleryWorkers("tests.integration.proj", 1, env, *options, cwd=ROOT)


@pytest.mark.slow
def test_at_prefetch_one_the_next_message_is_fetched_while_a_decision_is_in_flight(
    standalone_url: str,
) -> None:
    """The funnels' Redis is cut off while 3 tasks are sent: the first one's decision
    waits for its reply, and the worker has fetched the second meanwhile (2 un-acked,
    1 left in the queue; without the window it kept 1 and left 2), but not the third:
    the second's decision counts against the window (the bound, 1 per process). Healed,
    all 4 run once."""
    url = urlparse(standalone_url)
    with RedisServer() as broker, Proxy(url.port or 6379) as proxy:
        funnel_url = f"redis://127.0.0.1:{proxy.port}{url.path}"
        app = make_app(broker.url, funnel_url, store_url=standalone_url, task_ignore_result=True)
        client = redis.Redis.from_url(broker.url)
        with _worker(broker.url, funnel_url, standalone_url):
            ids = set(send(app, "proj.steady", 1))  # the gate's connection, opened
            wait_for(lambda: len(runs(standalone_url)) == 1, 30)
            proxy.cut()
            ids |= set(send(app, "proj.steady", 3))
            wait_for(lambda: client.hlen(UNACKED) >= 2, 15)
            assert (client.hlen(UNACKED), client.llen(QUEUE)) == (2, 1)
            assert len(runs(standalone_url)) == 1  # none ran without its decision
            proxy.heal()
            wait_for(lambda: len(runs(standalone_url)) == 4, 30)
        client.close()
        close_app(app)
    once_each(standalone_url, "proj.steady", ids)
