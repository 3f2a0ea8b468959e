"""A copy the gate publishes is pushed to the broker once, even when the broker's reply
is lost: a real Redis broker, the gate's own publisher (``_shared.publish``).

The fault matrix's broker restarts under load ran 2 of 200 tasks twice: the broker's
append-only file held each copy a wait published twice, with one copy token, its
first push the last write before the broker was killed and the second the first
after it came back (kombu's publish retry: the push had landed, its reply had not).
The copies' record tells copies apart by their token, so both ran. The gate's publish
is not retried: it raises, the message held stays un-acked, and the gate's next try
makes a new copy (a new token), or finds that the first one landed.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery

from celery_funnel._shared.publish import publish_message
from celery_funnel._stores.park import capture

pytestmark = pytest.mark.redis
ONE_REDIS = True  # one Redis version is enough here (tests/conftest.py)


def test_a_publish_whose_reply_is_lost_is_pushed_once(
    project_app: Celery, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = capture(
        project_app.tasks["proj.limited"].s(1), {}, ignore_result=True, add_to_parent=False
    )
    pushes: list[tuple[Any, ...]] = []
    push = redis.Redis.lpush

    def lost_reply(self: redis.Redis, *args: Any) -> Any:
        """The push lands; the first one's reply is lost with the connection."""
        reply = push(self, *args)
        pushes.append(args)
        if len(pushes) == 1:
            raise redis.exceptions.ConnectionError("the broker died before it replied")
        return reply

    monkeypatch.setattr(redis.Redis, "lpush", lost_reply)
    with pytest.raises(Exception, match="died before it replied"):
        publish_message(project_app, message)
    assert len(pushes) == 1, "published again under the same copy token"
    assert redis_client.llen("proj") == 1
    monkeypatch.undo()
    publish_message(project_app, message)  # the next publish finds the broker again
    assert redis_client.llen("proj") == 2
