"""The dashboard at 1280x800, in a real headless Chromium (issue 43, item 6): every
control stays within the page (they ran off it), a concurrency funnel shows its limit
("3 at once", it was blank), limit names show, and times read UTC, 24-hour, as the CLI
prints them (they were local, 12-hour). The screenshot is written to
build/dashboard-1280.png (build/ is not tracked), or $CELERY_FUNNEL_LAYOUT_SCREENSHOT."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_funnel import control
from celery_funnel.testing import RedisServer
from tests.integration.live_cluster import ROOT, Dashboard, chromium
from tests.integration.proj import close_app, make_app
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
SCREENSHOT = Path(ROOT) / (
    os.environ.get("CELERY_FUNNEL_LAYOUT_SCREENSHOT") or "build/dashboard-1280.png"
)
LIMITS = json.dumps({"reports.*": {"concurrency": 3}, "emails.*": "100/m"})
WIDTH, HEIGHT = 1280, 800


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Dashboard, Celery]]:
    """An open dashboard (loopback, no token) of the test project on a private Redis."""
    server = RedisServer().start()
    try:
        app = make_app(
            server.url, server.url, task_ignore_result=True, funnel_limits=json.loads(LIMITS)
        )
        env = {"FUNNEL_TEST_BROKER": server.url, "FUNNEL_TEST_REDIS": server.url,
               "FUNNEL_TEST_LIMITS": LIMITS}  # fmt: skip
        dashboard = Dashboard(env, token=None)
        try:
            dashboard.wait_ready()
            yield dashboard, app
        finally:
            dashboard.stop()
            close_app(app)
    finally:
        server.stop()


def test_the_dashboard_fits_1280_pixels_and_shows_every_limit(
    served: tuple[Dashboard, Celery],
) -> None:
    from selenium.webdriver.common.by import By

    dashboard, app = served
    control.set_override(app, "proj.hourly", "2/h", ttl="1h", by="test")
    control.pause(app, "proj.per_customer", by="test")
    browser = chromium(f"--window-size={WIDTH},{HEIGHT}")
    try:
        browser.set_window_size(WIDTH, HEIGHT)
        browser.get(dashboard.url + "/")
        reports = 'tr[data-funnel="limit:reports.*"]'
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, reports), 20)
        wait_for(lambda: browser.execute_script("return window.cfDashboard.updates") > 0, 10)
        viewport = browser.execute_script("return document.documentElement.clientWidth")
        assert viewport <= WIDTH
        edges = browser.execute_script(
            """return [...document.querySelectorAll('#funnels input, #funnels button')]
                .map((e) => [e.closest('tr').dataset.funnel, e.name || e.textContent,
                             e.getBoundingClientRect().right]);"""
        )
        assert len(edges) >= 8 * 10, "4 inputs and 4 buttons on each of 10 funnels or more"
        beyond = [(funnel, what, right) for funnel, what, right in edges if right > viewport]
        assert beyond == [], f"controls past the {viewport} px viewport: {beyond[:5]}"
        page = browser.execute_script("return document.documentElement.scrollWidth")
        assert page <= viewport, f"the page scrolls sideways: {page} px"

        assert re.fullmatch(
            r"updated \d\d:\d\d:\d\d UTC", browser.find_element(By.ID, "status").text
        )
        row = browser.find_element(By.CSS_SELECTOR, reports).text
        assert "3 at once" in row
        llm = browser.find_element(By.CSS_SELECTOR, 'tr[data-funnel="proj.llm"]').text
        assert "requests: 10/s (capacity 5, gcra)" in llm
        assert "tokens: 300/s (capacity 1500, gcra)" in llm
        hourly = browser.find_element(By.CSS_SELECTOR, 'tr[data-funnel="proj.hourly"]').text
        times = re.findall(r"\b\d\d:\d\d:\d\d UTC\b", hourly)
        assert len(times) == 2, hourly  # set at, until: UTC, 24-hour
        assert not re.search(r"\b[AP]M\b", browser.find_element(By.TAG_NAME, "body").text)
        browser.execute_script(  # the concurrency funnels' rows in the picture
            "document.querySelector(arguments[0]).scrollIntoView({block: 'center'})", reports
        )
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SCREENSHOT))
        print(f"screenshot: {SCREENSHOT}")
    finally:
        browser.quit()
        control.unset(app, "proj.hourly")
        control.unset(app, "proj.per_customer")
