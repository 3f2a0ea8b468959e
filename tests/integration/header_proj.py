"""A Celery project for the header tests (``celery -A tests.integration.header_proj
worker``), configured from FUNNEL_TEST_* environment variables: funnelled tasks that send
others from their runs (``delay``, ``apply_async``, chains, groups, chords, ``retry``,
``replace``), and un-funnelled children. Every run records what its request's headers
said (``celery_funnel``) in the Redis list ``seen``, so that a test can tell which runs
carried a header no gate gave them."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import redis
from celery import Celery, chain, chord, group

from celery_funnel import FunnelTask
from celery_funnel._shared.state import HEADER
from tests.integration.proj import new_app

SEEN = "seen"
PARENTS = (0, 1, 2, 3, 4, 5)  # sent alone; 10-15 are sent in canvases
# what each replacer is replaced by (see ``replacer``), by its number
REPLACEMENTS = (
    "child", "child", "same", "same", "same", "same", "chain", "chain", "chord", "chord",
)  # fmt: skip
# what each parent sends from its body
KIDS = (
    "delay", "funnelled-apply", "chain-a", "chain-b", "group-a", "funnelled-group",
    "chord-a", "chord-b", "chord",
)  # fmt: skip


def make_app(broker_url: str, funnel_url: str, queue: str = "hdr", **conf: Any) -> Celery:
    """The app: funnels, results and run records in the funnels' Redis; tasks sent to
    and consumed from ``queue``. ``FUNNEL_TEST_RATE`` is the funnelled tasks' rate."""
    app = new_app("header_proj", broker_url, funnel_url, queue, funnel_url, **conf)
    store = redis.Redis.from_url(funnel_url)
    rate = os.environ.get("FUNNEL_TEST_RATE", "2/s")

    def seen(task: Any, label: str) -> None:
        request = task.request
        record = {
            "label": label, "id": request.id, "name": task.name,
            "header": (request.headers or {}).get(HEADER), "retries": request.retries,
            "worker": request.hostname or socket.gethostname(),
        }  # fmt: skip
        store.rpush(SEEN, json.dumps(record))

    def task(name: str, **options: Any) -> Any:
        return app.task(shared=False, name=name, bind=True, **options)

    def funnelled(name: str, **options: Any) -> Any:
        return task(name, base=FunnelTask, **{"funnel_rate": rate, **options})

    @task("hdr.child")
    def child(self: Any, label: str, *_: Any) -> str:
        seen(self, label)
        return label

    # a funnel that never refuses: its runs carry the header its own gate gave them
    @funnelled("hdr.funnelled_child", funnel_rate="1000/s", funnel_capacity=1000)
    def funnelled_child(self: Any, label: str, *_: Any) -> str:
        seen(self, label)
        return label

    @funnelled("hdr.parent")
    def parent(self: Any, n: int) -> int:
        seen(self, f"parent:{n}")
        child.delay(f"delay:{n}")
        funnelled_child.apply_async((f"funnelled-apply:{n}",))
        chain(child.si(f"chain-a:{n}"), child.si(f"chain-b:{n}")).delay()
        group(child.si(f"group-a:{n}"), funnelled_child.si(f"funnelled-group:{n}")).delay()
        chord([child.si(f"chord-a:{n}"), child.si(f"chord-b:{n}")], child.si(f"chord:{n}")).delay()
        return n

    @funnelled("hdr.retrier", funnel_key="{key}")
    def retrier(self: Any, key: str, n: int, again: str) -> int:
        """Retries once: onto a funnel of its own that admits it at once (``again`` is
        "fresh"), or onto the same funnel, where it waits again ("same")."""
        seen(self, f"{'retry' if self.request.retries else 'first'}-{again}:{n}")
        if not self.request.retries:
            retry_key = key if again == "same" else f"{key}-retry-{n}"
            raise self.retry(args=(retry_key, n, again), countdown=0)
        return n

    @funnelled("hdr.replacer")
    def replacer(self: Any, n: int, into: str) -> None:
        """Replaced by an un-funnelled child ("child"); or first by itself, on the same
        funnel, where it waits again ("same"); or by a chain ("chain") or a chord
        ("chord") whose last task, itself again, takes its task id (Celery's ``replace``)
        and is sent by another run: an earlier link, the chord's last header task."""
        seen(self, f"replacer-{into}:{n}")
        again = replacer.si(n, "child")
        replacement = {
            "child": child.si(f"replace:{n}"),
            "same": again,
            "chain": chain(child.si(f"replace-link:{n}"), again),
            "chord": chord([child.si(f"replace-header:{n}")], again),
        }[into]
        raise self.replace(replacement)

    # one at a time: the waiters are parked and handed the slot (a "promised" header)
    @funnelled("hdr.leased", funnel_rate=None, funnel_concurrency=1)
    def leased(self: Any, n: int) -> int:
        seen(self, f"leased:{n}")
        child.delay(f"leased-child:{n}")
        return n

    @task("hdr.send_all")
    def send_all(self: Any) -> None:
        """Funnelled parents (most wait) that send children from their bodies, sent
        alone and inside canvases; tasks that retry and that replace themselves."""
        seen(self, "send-all")
        for n in PARENTS:
            parent.delay(n)
        chain(parent.si(10), child.si("link:10")).delay()
        chord([parent.si(11), parent.si(12)], child.si("chord-body:11")).delay()
        parent.apply_async((13,), link=child.si("callback:13"))
        group(parent.si(14), parent.si(15)).delay()
        for n in range(4):  # the first runs wait on "k"; each retry has a funnel of its own
            retrier.delay("k", n, "fresh")
        for n in range(6):  # first runs and retries wait on one funnel
            retrier.delay("s", n, "same")
        for n, into in enumerate(REPLACEMENTS):
            replacer.delay(n, into)
        for n in range(3):
            leased.delay(n)

    return app


def seen_runs(funnel_url: str) -> list[dict[str, Any]]:
    """Every run recorded so far."""
    with redis.Redis.from_url(funnel_url) as store:
        return [json.loads(item) for item in store.lrange(SEEN, 0, -1)]


if os.environ.get("FUNNEL_TEST_BROKER"):
    extra: dict[str, Any] = {}
    if os.environ.get("FUNNEL_TEST_PARK_AFTER"):
        extra["funnel_park_after"] = float(os.environ["FUNNEL_TEST_PARK_AFTER"])
    if os.environ.get("FUNNEL_TEST_PARK") == "0":
        extra["funnel_park"] = False
    app = make_app(
        os.environ["FUNNEL_TEST_BROKER"],
        os.environ["FUNNEL_TEST_REDIS"],
        queue=os.environ.get("FUNNEL_TEST_QUEUE", "hdr"),
        **extra,
    )
