"""An open dashboard answers only this machine's loopback names (against DNS rebinding):
its ASGI app called directly, without a server or a Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_funnel.dashboard import create_app
from celery_funnel.dashboard._security import CSRF_COOKIE, host_name

LOOPBACK = ["localhost", "localhost:5566", "LocalHost:5566", "127.0.0.1", "127.0.0.1:5566",
            "[::1]", "[::1]:5566", "127.0.0.2:5566"]  # fmt: skip
# a name an attacker's DNS can point at 127.0.0.1, or no name this machine answers to
FOREIGN = ["evil.example", "evil.example:5566", "127.0.0.1.nip.io:5566", "foo.localhost",
           "localhost.evil.example", "0.0.0.0:5566", "192.168.1.2", "::1", "127.0.0.1:x",
           "[::1", "", None]  # fmt: skip
TOKEN = "t" * 16


def call(asgi: Any, method: str, path: str, host: str | None, **headers: str) -> tuple[int, str]:
    """(status, body) of one request to ``asgi`` with this ``Host`` (None: none)."""
    raw = [(b"host", host.encode())] if host is not None else []
    raw += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": raw, "server": ("127.0.0.1", 5566),
        "client": ("127.0.0.1", 40000),
    }  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        done = asyncio.Event()  # the client stays until the whole answer came
        requests = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if requests:
                return requests.pop()
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await asyncio.wait_for(asgi(scope, receive, send), 10)

    asyncio.run(run())
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body.decode()


@pytest.fixture
def celery_app() -> Iterator[Celery]:
    app = Celery("hosts", set_as_current=False)
    yield app
    app.close()


def rebound_post(asgi: Any, host: str | None) -> tuple[int, str]:
    """A control as a rebound page sends it: its own Origin, and the CSRF cookie the
    page it read handed it, echoed in the header."""
    return call(
        asgi, "POST", "/api/pause/proj.steady", host,
        origin=f"http://{host}", x_csrf_token="c" * 32, cookie=f"{CSRF_COOKIE}={'c' * 32}",
        content_type="application/json",
    )  # fmt: skip


@pytest.mark.parametrize("host", FOREIGN)
def test_an_open_dashboard_refuses_a_foreign_host(celery_app: Any, host: str | None) -> None:
    asgi = create_app(celery_app)
    for status, body in (
        call(asgi, "GET", "/", host),
        call(asgi, "GET", "/api/state", host),
        call(asgi, "GET", "/api/series", host),
        call(asgi, "GET", "/static/dashboard.js", host),
        rebound_post(asgi, host),
    ):
        assert status == 403
        assert "is not this machine's loopback name" in body
        assert body.strip().count("\n") == 0  # one line


@pytest.mark.parametrize("host", LOOPBACK)
def test_an_open_dashboard_answers_its_loopback_names(celery_app: Any, host: str) -> None:
    asgi = create_app(celery_app)
    status, page = call(asgi, "GET", "/", host)
    assert (status, "<title>" in page) == (200, True)
    assert call(asgi, "GET", "/static/uPlot.LICENSE", host)[0] == 200
    # a control reaches its own checks (this one has no CSRF token): past the Host's
    status, body = call(asgi, "POST", "/api/pause/x", host)
    assert (status, body) == (403, '{"error":"missing or wrong CSRF token"}')


def test_behind_a_token_any_host_is_answered_as_before(celery_app: Any) -> None:
    asgi = create_app(celery_app, token=TOKEN)
    assert call(asgi, "GET", "/", "evil.example:5566")[0] == 401  # no token: as ever
    bearer = {"authorization": f"Bearer {TOKEN}"}
    assert call(asgi, "GET", "/", "funnels.example.com", **bearer)[0] == 200


def test_allowed_hosts_add_names_to_an_open_dashboard(celery_app: Any) -> None:
    asgi = create_app(celery_app, allowed_hosts=["Ops.Example.com"])
    assert call(asgi, "GET", "/", "ops.example.com:8000")[0] == 200
    assert call(asgi, "GET", "/", "localhost")[0] == 200
    assert call(asgi, "GET", "/", "evil.example")[0] == 403


@pytest.mark.parametrize(
    ("header", "name"),
    [("LOCALHOST:5566", "localhost"), ("[::1]:80", "[::1]"), ("[::1]", "[::1]"),
     ("a.b", "a.b"), ("[::1", None), ("a:b", None), ("a:", None), (":80", None), ("", None)],
)  # fmt: skip
def test_host_names(header: str, name: str | None) -> None:
    assert host_name(header) == name


# Origins a page of another site can send (or that name another origin) that look like
# the dashboard's own, http://127.0.0.1:5566: each is refused, whatever its likeness
LOOK_ALIKES = [
    "http://127.0.0.1:5566.evil.example",  # a subdomain of the attacker's
    "http://127.0.0.1:5566@evil.example",  # user info: the host is evil.example
    "http://evil.example/?http://127.0.0.1:5566",  # the origin in a query
    "http://evil.example#127.0.0.1:5566",
    "http://evil.example:5566",  # another host
    "http://127.0.0.1:5567",  # another port
    "http://127.0.0.1:55660",
    "http://127.0.0.1",  # port 80
    "http://127.0.0.1:556",
    "http://localhost:5566",  # another name of this machine: another origin
    "http://x127.0.0.1:5566",
    "null",  # a sandboxed page, a data: URL
    "",
]


def control_from(asgi: Any, origin: str | None, host: str = "127.0.0.1:5566") -> tuple[int, str]:
    """A control with the page's CSRF token (cookie and header) and this ``Origin``; an
    action that no Redis answers, so that what passes the CSRF check says so (404)."""
    headers = {"x_csrf_token": "c" * 32, "cookie": f"{CSRF_COOKIE}={'c' * 32}"}
    if origin is not None:
        headers["origin"] = origin
    return call(asgi, "POST", "/api/nope/proj.steady", host, **headers)


@pytest.mark.parametrize("origin", LOOK_ALIKES)
def test_a_control_from_a_look_alike_origin_is_refused(celery_app: Any, origin: str) -> None:
    asgi = create_app(celery_app)
    assert control_from(asgi, origin) == (403, '{"error":"missing or wrong CSRF token"}')


@pytest.mark.parametrize(
    ("origin", "host"),
    [("http://127.0.0.1:5566", "127.0.0.1:5566"), ("http://localhost:5566", "localhost:5566"),
     ("http://[::1]:5566", "[::1]:5566"), ("http://127.0.0.1", "127.0.0.1"), (None, "127.0.0.1")],
)  # fmt: skip
def test_a_control_from_the_dashboards_own_origin_passes(
    celery_app: Any, origin: str | None, host: str
) -> None:
    """Its exact origin (or none: a same-origin request of an older browser) passes the
    CSRF check, and reaches the action (none such here: 404)."""
    asgi = create_app(celery_app)
    assert control_from(asgi, origin, host) == (404, '{"error":"no action \'nope\'"}')
