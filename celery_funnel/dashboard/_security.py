"""Who may use the dashboard, and which requests may change anything.

- Bound to a loopback address it may run open; bound elsewhere it refuses to start
  without a token or basic auth (``check_binding``).
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
from dataclasses import dataclass

from starlette.requests import Request

from .._limiter.errors import ConfigurationError

__all__ = ["AUTH_COOKIE", "CSRF_COOKIE", "CSRF_HEADER", "Guard", "check_binding"]

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
    return origin.split("://", 1)[-1] == host
