"""The web dashboard (its extra: ``pip install '.[dashboard]'``): every funnel of a
Celery app live, with its limit, override, level, parked and held tasks, admitted and
deferred per second over the last hour, and controls to set, pause, resume and unset.

Run it with ``celery -A proj funnel dashboard [--port 5566] [--host 127.0.0.1]``, or
mount the ASGI app ``create_app(celery_app)`` in your own (Starlette/FastAPI:
``app.mount("/funnels", create_app(celery_app, token=...))``; a WSGI app such as
Flask or Django through an ASGI-to-WSGI adapter, e.g. ``a2wsgi.ASGIMiddleware``).

Its charts use uPlot (MIT licence, ``static/uPlot.LICENSE``), shipped in the package.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import Any

from .._limiter.words import missing_extra

try:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        missing_extra("celery_funnel.dashboard", "Starlette and uvicorn", "starlette uvicorn")
    ) from exc

from .._limiter.errors import ConfigurationError
from .._ops import control
from ._security import (
    AUTH_COOKIE,
    CSRF_COOKIE,
    Guard,
    HostCheck,
    check_binding,
    csrf_ok,
    new_csrf,
)
from ._state import ConcurrencyHook, funnel_state, no_concurrency, series

__all__ = ["ConcurrencyHook", "create_app", "serve"]

ACTIONS = ("set", "pause", "resume", "unset")
FIELDS = ("rate", "capacity", "concurrency", "ttl")


def _page() -> str:
    return resources.files(__package__).joinpath("page.html").read_text("utf-8")


class _Views:
    """The endpoints, bound to one Celery app and one ``Guard``."""

    def __init__(self, app: Any, guard: Guard, hook: ConcurrencyHook) -> None:
        self.app, self.guard, self.hook = app, guard, hook

    def _denied(self, request: Request) -> Response | None:
        if self.guard.allowed(request):
            return None
        return JSONResponse({"error": "unauthorized"}, 401, headers=self.guard.challenge())

    def index(self, request: Request) -> Response:
        token = request.query_params.get("token")
        if token and self.guard.token and token == self.guard.token:
            # the token leaves the address bar: kept in a cookie only this site sends
            back = RedirectResponse(request.url.path, 303)
            back.set_cookie(AUTH_COOKIE, token, httponly=True, samesite="strict")
            return back
        denied = self._denied(request)
        if denied is not None:
            return denied
        csrf = request.cookies.get(CSRF_COOKIE) or new_csrf()
        page = HTMLResponse(_page().replace("{{csrf}}", csrf))
        page.set_cookie(CSRF_COOKIE, csrf, samesite="strict")
        return page

    def state(self, request: Request) -> Response:
        return self._denied(request) or JSONResponse(funnel_state(self.app, self.hook))

    def series(self, request: Request) -> Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        since = request.query_params.get("since")
        try:
            start = None if since is None else float(since)
        except ValueError:
            return JSONResponse({"error": f"since must be a number, got {since!r}"}, 400)
        return JSONResponse(series(self.app, start))

    async def control(self, request: Request) -> Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        if not csrf_ok(request):
            return JSONResponse({"error": "missing or wrong CSRF token"}, 403)
        action, name = request.path_params["action"], request.path_params["name"]
        if action not in ACTIONS:
            return JSONResponse({"error": f"no action {action!r}"}, 404)
        try:
            body = await request.json() if await request.body() else {}
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, 400)
        values = {f: body.get(f) or None for f in FIELDS} if isinstance(body, dict) else {}
        try:  # Redis calls: off the event loop
            result = await run_in_threadpool(_apply, self.app, action, name, values)
        except ConfigurationError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        return JSONResponse({"ok": True, "override": result})


def _apply(app: Any, action: str, name: str, values: dict[str, Any]) -> Any:
    """Run one control; the override left (plain values), or whether there was one."""
    if action == "set":
        entry = control.set_override(
            app, name, values.get("rate"), ttl=values.get("ttl"),
            capacity=_int("capacity", values.get("capacity")),
            concurrency=_int("concurrency", values.get("concurrency")),
        )  # fmt: skip
        return entry.as_dict()
    if action == "pause":
        return control.pause(app, name, ttl=values.get("ttl")).as_dict()
    if action == "resume":
        left = control.resume(app, name)
        return None if left is None else left.as_dict()
    return control.unset(app, name)


def _int(field: str, value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"override {field} must be an integer, got {value!r}") from None


def create_app(
    celery_app: Any,
    *,
    token: str | None = None,
    basic_auth: str | None = None,
    concurrency: ConcurrencyHook = no_concurrency,
    allowed_hosts: Iterable[str] = (),
) -> Starlette:
    """The dashboard of ``celery_app`` as an ASGI app. ``token`` and/or ``basic_auth``
    (``"user:password"``) protect it; mounted in your app, your own authentication
    may protect it as well. ``concurrency(app, name)``: how many tasks of funnel
    ``name`` run now (None: no concurrency limit), shown per funnel.

    Without a token or basic auth it answers only requests for this machine's loopback
    names (``Host`` ``localhost``, ``127.0.0.1``, ``[::1]``, any port), against DNS
    rebinding; ``allowed_hosts`` adds names (without port) for an open dashboard
    mounted in an app whose own authentication protects it.

    Raises:
        ConfigurationError: for a token shorter than 16 characters or a malformed
            ``basic_auth``.
    """
    check_binding("127.0.0.1", token, basic_auth)
    guard = Guard(token, basic_auth)
    views = _Views(celery_app, guard, concurrency)
    static = StaticFiles(directory=str(resources.files(__package__).joinpath("static")))
    # behind a token or basic auth a rebound name gains nothing: the browser sends
    # neither to it
    hosts = [Middleware(HostCheck, also=tuple(allowed_hosts))] if guard.open else []
    return Starlette(
        middleware=hosts,
        routes=[
            Route("/", views.index),
            Route("/api/state", views.state),
            Route("/api/series", views.series),
            Route("/api/{action}/{name:path}", views.control, methods=["POST"]),
            Mount("/static", static, name="static"),
        ],
    )


def serve(
    celery_app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 5566,
    token: str | None = None,
    basic_auth: str | None = None,
) -> None:
    """Serve the dashboard with uvicorn until interrupted. Bound beyond this machine
    (not a loopback address), it needs ``token`` or ``basic_auth``.

    Raises:
        ConfigurationError: when it would be open beyond this machine.
    """
    import uvicorn  # noqa: PLC0415 - only when serving

    check_binding(host, token, basic_auth)
    asgi = create_app(celery_app, token=token, basic_auth=basic_auth)
    uvicorn.run(asgi, host=host, port=port, log_level="info")
