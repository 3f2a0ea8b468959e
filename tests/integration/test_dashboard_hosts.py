"""DNS rebinding against an open dashboard: ``celery funnel dashboard`` without a token
(loopback only) answers its loopback names and refuses any other ``Host``, for its page,
its API and its controls; in a real headless Chromium, a page of a foreign name pointed
at 127.0.0.1 (``--host-resolver-rules``) sees only the refusal."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_funnel import control
from celery_funnel.dashboard._security import CSRF_COOKIE
from celery_funnel.testing import RedisServer
from tests.integration.live_cluster import ROOT, TASK, Dashboard, chromium
from tests.integration.proj import close_app, make_app
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
# build/ is not tracked
SCREENSHOT = Path(ROOT) / (
    os.environ.get("CELERY_FUNNEL_REBINDING_SCREENSHOT") or "build/dashboard-foreign-host.png"
)
FOREIGN = "evil.example"
REFUSED = "is not this machine's loopback name"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Dashboard, Celery]]:
    """An open dashboard (no token) of the test project on a private Redis, and an app
    of that project to read its overrides with."""
    server = RedisServer().start()
    try:
        app = make_app(server.url, server.url, task_ignore_result=True)
        dashboard = Dashboard({"FUNNEL_TEST_BROKER": server.url, "FUNNEL_TEST_REDIS": server.url},
                              token=None)  # fmt: skip
        try:
            dashboard.wait_ready()
            yield dashboard, app
        finally:
            dashboard.stop()
            control.unset(app, TASK)
            close_app(app)
    finally:
        server.stop()


def control_as(
    dashboard: Dashboard, host: str, action: str, origin: str | None = None
) -> tuple[int, str]:
    """A control sent as the page at ``host`` sends it: its Origin (or ``origin``), and
    the CSRF cookie the page was handed, echoed in the header (all a rebound page can
    carry too)."""
    csrf = "c" * 32
    headers = {
        "Host": host, "Origin": origin or f"http://{host}", "Content-Type": "application/json",
        "X-CSRF-Token": csrf, "Cookie": f"{CSRF_COOKIE}={csrf}",
    }  # fmt: skip
    return dashboard.request(f"/api/{action}/{TASK}", "POST", b"{}", headers)


def test_a_foreign_host_is_refused_for_the_page_the_api_and_the_controls(
    served: tuple[Dashboard, Celery],
) -> None:
    dashboard, app = served
    host = f"{FOREIGN}:{dashboard.port}"
    for status, body in (
        dashboard.request("/", "GET", None, {"Host": host}),
        dashboard.request("/api/state", "GET", None, {"Host": host}),
        dashboard.request("/api/series", "GET", None, {"Host": host}),
        control_as(dashboard, host, "pause"),
    ):
        assert status == 403
        assert REFUSED in body
        assert FOREIGN in body
    assert TASK not in control.overrides(app), "nothing was paused"


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "[::1]"])
def test_loopback_hosts_are_answered(served: tuple[Dashboard, Celery], name: str) -> None:
    dashboard, app = served
    host = f"{name}:{dashboard.port}"
    status, page = dashboard.request("/", "GET", None, {"Host": host})
    assert status == 200
    assert "<title>celery-funnel dashboard</title>" in page
    status, body = dashboard.request("/api/state", "GET", None, {"Host": host})
    assert status == 200, body
    assert TASK in body
    status, body = control_as(dashboard, host, "pause")
    assert status == 200, body
    assert control.overrides(app)[TASK].paused
    assert control_as(dashboard, host, "unset")[0] == 200
    assert TASK not in control.overrides(app)
    # and without the port, as a browser sends it for port 80
    assert dashboard.request("/", "GET", None, {"Host": name})[0] == 200


def test_a_control_from_an_origin_that_only_looks_like_the_dashboards_is_refused(
    served: tuple[Dashboard, Celery],
) -> None:
    """The dashboard's own Host, its CSRF token, and an Origin that contains or resembles
    its own (another site's page sends its own Origin): refused, nothing paused; the
    exact origin pauses."""
    dashboard, app = served
    own = f"127.0.0.1:{dashboard.port}"
    for origin in (
        f"http://{own}.evil.example", f"http://{own}@evil.example",
        f"http://evil.example/?http://{own}", f"http://127.0.0.1:{dashboard.port + 1}",
        f"http://127.0.0.1:{dashboard.port}0", f"http://{FOREIGN}:{dashboard.port}",
    ):  # fmt: skip
        status, body = control_as(dashboard, own, "pause", origin)
        assert (status, body) == (403, '{"error":"missing or wrong CSRF token"}'), origin
        assert TASK not in control.overrides(app), origin
    assert control_as(dashboard, own, "pause", f"http://{own}")[0] == 200
    assert control.overrides(app)[TASK].paused
    assert control_as(dashboard, own, "unset")[0] == 200
    assert TASK not in control.overrides(app)


def test_a_rebound_page_in_a_browser_sees_only_the_refusal(
    served: tuple[Dashboard, Celery],
) -> None:
    from selenium.webdriver.common.by import By

    dashboard, app = served
    browser = chromium(f"--host-resolver-rules=MAP {FOREIGN} 127.0.0.1")
    try:
        browser.get(f"http://{FOREIGN}:{dashboard.port}/")
        shown = browser.find_element(By.TAG_NAME, "body").text
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SCREENSHOT))
        assert REFUSED in shown
        assert f"{FOREIGN}:{dashboard.port}" in shown
        assert not browser.find_elements(By.CSS_SELECTOR, "#funnels")
        # what the rebound page's own script would do, being of the same origin now:
        # read the page for its CSRF token (the cookie comes with it), then pause
        tried = browser.execute_async_script(
            """const [name, done] = arguments;
            (async () => {
              const page = await fetch("/");
              const csrf = ((await page.text()).match(/name="csrf" content="([^"]+)"/)
                            || [])[1] || "";
              const state = await fetch("/api/state");
              const pause = await fetch("/api/pause/" + name, {method: "POST", body: "{}",
                headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf}});
              done([page.status, state.status, pause.status]);
            })();""",
            TASK,
        )
        assert tried == [403, 403, 403]
        assert TASK not in control.overrides(app)
        # the same browser on the dashboard's own name sees the dashboard
        browser.get(f"{dashboard.url}/")
        row = f'tr[data-funnel="{TASK}"]'
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, row), 20)
    finally:
        browser.quit()
    print(f"screenshot: {SCREENSHOT} ({json.dumps(shown)})")
