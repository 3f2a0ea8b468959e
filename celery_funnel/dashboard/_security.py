"""Who may use the dashboard, and which requests may change anything.

- Bound to a loopback address it may run open; bound elsewhere it refuses to start
  without a token or basic auth (``check_binding``).
- Open, it answers only requests whose ``Host`` is this machine's loopback name
  (``localhost``, ``127.0.0.1``, ``[::1]``, any port; ``HostCheck``): else a page of
  any site could point its own DNS name at 127.0.0.1 (DNS rebinding) and, being then
  of the same origin, read the dashboard and send its controls with their CSRF token.
- With a token, a request carries it as ``Authorization: Bearer <token>``, or in the
  cookie the page sets after it was opened once as ``/?token=<token>``; with basic
  auth, as ``Authorization: Basic`` (the browser asks). Compared in constant time.
- Every control is a POST that carries the CSRF token of the page (a random value in a
  ``SameSite=Strict`` cookie, echoed in the ``X-CSRF-Token`` header: a page of another
  site can send neither), and whose ``Origin``, when sent, is the dashboard's own.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .._limiter.errors import ConfigurationError

__all__ = ["AUTH_COOKIE", "CSRF_COOKIE", "CSRF_HEADER", "Guard", "HostCheck", "check_binding"]

AUTH_COOKIE = "celery_funnel_token"
CSRF_COOKIE = "celery_funnel_csrf"
CSRF_HEADER = "x-csrf-token"
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the dashboard on this machine."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The name in a ``Host`` header, lowercase, without its port (``"[::1]"`` keeps its
    brackets); None when it is not ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``."""
    name, port = header.strip().lower(), ""
    if name.startswith("["):
        end = name.find("]")
        if end < 0:
            return None
        name, port = name[: end + 1], name[end + 1 :]
    elif ":" in name:
        name, port = name.rsplit(":", 1)
        port = ":" + port
    if port and not (port[0] == ":" and port[1:].isdigit() and port[1:].isascii()):
        return None
    return name or None


def loopback_name(name: str) -> bool:
    """Whether ``name`` (from ``host_name``) can only mean this machine to a browser:
    ``localhost``, or a loopback address written out (an address cannot be re-pointed
    as a DNS name can)."""
    if ":" in name and not name.startswith("["):
        return False  # an IPv6 address in a Host header is always bracketed
    return is_loopback(name)


class HostCheck:
    """ASGI middleware of an open dashboard: a request whose ``Host`` is neither a
    loopback name nor one of ``also`` is refused (403, one line) before any view,
    static file or control sees it."""

    def __init__(self, app: ASGIApp, also: Iterable[str] = ()) -> None:
        self.app = app
        self.also = frozenset(name.lower() for name in also)

    def allowed(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header may be answered."""
        name = host_name(header or "")
        return name is not None and (loopback_name(name) or name in self.also)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":  # the dashboard has no websocket
            header = Headers(scope=scope).get("host")
            if not self.allowed(header):
                await _refusal(scope, header)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _refusal(scope: Scope, header: str | None) -> Response:
    reason = (
        f"refused: Host {header!r} is not this machine's loopback name; an open dashboard"
        " answers only localhost, 127.0.0.1 and [::1] (give it a token or basic auth to"
        " serve other names)"
    )
    if "/api/" in str(scope.get("path", "")):  # the page's scripts read JSON errors
        return JSONResponse({"error": reason}, 403)
    return PlainTextResponse(reason + "\n", 403)


def check_binding(host: str, token: str | None, basic_auth: str | None) -> None:
    """Refuse to serve beyond this machine without a token or basic auth.

    Raises:
        ConfigurationError: naming the host, or a malformed ``basic_auth``.
    """
    if basic_auth is not None and ":" not in basic_auth:
        raise ConfigurationError("dashboard basic auth must be 'user:password'")
    if token is not None and len(token) < 16:
        raise ConfigurationError("dashboard token must be at least 16 characters long")
    if not is_loopback(host) and not (token or basic_auth):
        raise ConfigurationError(
            f"the dashboard is bound to {host!r}, beyond this machine: give --token (or"
            " $CELERY_FUNNEL_DASHBOARD_TOKEN) or --basic-auth user:password"
        )


@dataclass(frozen=True)
class Guard:
    """Checks requests against the configured ``token`` and/or ``basic_auth``."""

    token: str | None = None
    basic_auth: str | None = None

    @property
    def open(self) -> bool:
        return not (self.token or self.basic_auth)

    def allowed(self, request: Request) -> bool:
        """Whether ``request`` is authenticated (always, when nothing is configured)."""
        if self.open:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if self.token:
            given = value if scheme.lower() == "bearer" else request.cookies.get(AUTH_COOKIE, "")
            if given and hmac.compare_digest(given.encode(), self.token.encode()):
                return True
        if self.basic_auth and scheme.lower() == "basic":
            try:
                given = base64.b64decode(value, validate=True).decode()
            except ValueError:
                return False
            return hmac.compare_digest(given.encode(), self.basic_auth.encode())
        return False

    def challenge(self) -> dict[str, str]:
        """The headers of a 401 answer (the browser asks for basic auth)."""
        if self.basic_auth:
            return {"WWW-Authenticate": 'Basic realm="celery-funnel"'}
        return {}


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def csrf_ok(request: Request) -> bool:
    """Whether a POST carries the page's CSRF token and comes from the page's origin."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    header = request.headers.get(CSRF_HEADER, "")
    if not cookie or not hmac.compare_digest(cookie.encode(), header.encode()):
        return False
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    scheme, _, rest = origin.partition("://")
    # the scheme may differ behind a TLS proxy; the host and port may not
    return scheme in ("http", "https") and rest == host
