"""The dashboard of a full concurrency funnel, in a real headless Chromium at 1280 and
1920 px (issue 55, item 1): two real workers run ``proj.seated`` (2 at a time) while six
more wait for a seat. Its row showed ``idle`` and no decision, and it had no chart; now
its level reads ``2/2 in use`` (as ``funnel status`` counts the seats), its admitted
and deferred decisions are charted, every chart spans the same last hour and fills its
panel, and the time labels under a chart never touch. The screenshots are written to
build/dashboard-charts-<width>.png (build/ is not tracked)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_funnel.testing import CeleryWorkers, RedisServer
from tests.integration.live_cluster import ROOT, Dashboard, chromium
from tests.integration.proj import RELEASE, close_app, make_app, runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TASK = "proj.seated"  # funnel_concurrency=2, each run holds until RELEASE
SENT = 8
ROW = f'tr[data-funnel="{TASK}"]'

# per chart: its panel's inner width, the plot's width, the x range, and each tick
# label's left and right edge (px, measured with the canvas font uPlot draws it in)
CHARTS = """
const found = [];
for (const [funnel, u] of Object.entries(window.cfDashboard.charts)) {
  const box = u.root.parentNode;
  const style = getComputedStyle(box);
  const inner = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  const axis = u.axes[0];
  u.ctx.font = axis.font[0];
  const edges = axis._splits.map((s, i) => {
    const x = u.valToPos(s, 'x');
    const w = u.ctx.measureText(String(axis._values[i])).width;
    return [x - w / 2, x + w / 2, String(axis._values[i])];
  });
  found.push({funnel, inner, plot: u.width, min: u.scales.x.min, max: u.scales.x.max, edges});
}
return found;
"""


@pytest.fixture(scope="module")
def seated() -> Iterator[tuple[Dashboard, Celery, str]]:
    """Two workers holding two runs of TASK, six more waiting for a seat, and an open
    dashboard (loopback, no token) of the project."""
    server = RedisServer().start()  # the broker's own Redis: waiters are parked there
    url = server.url
    app = make_app(url, url, task_ignore_result=True)
    env = {"FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url}
    workers = CeleryWorkers(
        "tests.integration.proj", 2, env, "-c", "4", "-Q", "proj", cwd=ROOT
    ).start()
    dashboard = None
    try:
        workers.wait_ready()
        for n in range(SENT):
            app.tasks[TASK].delay(n)
        wait_for(lambda: len(runs(url)) == 2, 60)
        for n in range(5):  # and a rate funnel's chart beside it, its first point later
            app.tasks["proj.limited"].delay(n)
        wait_for(lambda: len(runs(url)) == 2 + 5, 60)
        dashboard = Dashboard(env, token=None)
        dashboard.wait_ready()
        yield dashboard, app, url
    finally:
        with redis.Redis.from_url(url) as client:
            client.set(RELEASE, 1)  # the runs end: the workers stop at once
        try:
            if dashboard is not None:
                dashboard.stop()
            workers.stop()
        finally:
            close_app(app)
            server.stop()


def status(url: str) -> list[dict[str, Any]]:
    """``celery funnel status --json`` of the project, as a user runs it."""
    env = {"FUNNEL_TEST_BROKER": url, "FUNNEL_TEST_REDIS": url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "funnel", "status",
         "--json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=True,
    )  # fmt: skip
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


@pytest.mark.parametrize("width", [1280, 1920])
def test_a_full_concurrency_funnel_and_the_charts(
    seated: tuple[Dashboard, Celery, str], width: int
) -> None:
    from selenium.webdriver.common.by import By

    dashboard, _, url = seated
    (row,) = [r for r in status(url) if r["name"] == TASK and r["kind"] == "concurrency"]
    assert (row["in_use"], row["capacity"], row["parked"]) == (2, 2, SENT - 2)

    browser = chromium(f"--window-size={width},900")
    try:
        browser.set_window_size(width, 900)
        browser.get(dashboard.url + "/")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ROW), 20)

        # the workers write their counts about twice a second: the page reads them
        def total(kind: str) -> int:
            script = f"return window.cfDashboard.{kind}[arguments[0]] || 0"
            return int(browser.execute_script(script, TASK))

        wait_for(lambda: total("admitted") == 2, 30)
        wait_for(lambda: total("deferred") >= SENT - 2, 30)
        cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, f"{ROW} td")]
        level, parked, running = cells[3], cells[6], cells[8]
        assert "2/2 in use" in level, cells
        assert "idle" not in level
        assert (parked, running) == (str(SENT - 2), "2"), cells

        charts = browser.execute_script(CHARTS)
        assert {c["funnel"] for c in charts} == {TASK, "proj.limited"}, "a chart for each"
        now = browser.execute_script("return Date.now() / 1000")
        for chart in charts:
            name = chart["funnel"]
            assert chart["plot"] >= chart["inner"] - 2, f"{name}: the plot fills its panel"
            span = chart["max"] - chart["min"]
            assert 3590 <= span <= 3600, f"{name}: the last hour, not {span} s"
            assert now - chart["max"] < 30, name
            assert len(chart["edges"]) >= 3, chart
            for (_, right, text), (left, _, after) in itertools.pairwise(chart["edges"]):
                assert left - right >= 8, f"{name}: labels {text!r} and {after!r} touch"
        (first, *rest) = charts
        assert all((c["min"], c["max"]) == (first["min"], first["max"]) for c in rest)

        browser.execute_script(
            "document.querySelector(arguments[0]).scrollIntoView({block: 'start'})", ROW
        )
        shot = Path(ROOT) / f"build/dashboard-charts-{width}.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        browser.set_window_size(width, 1400)
        browser.save_screenshot(str(shot))
        print(f"screenshot: {shot}")
    finally:
        browser.quit()
