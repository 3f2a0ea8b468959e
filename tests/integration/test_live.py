"""Operating funnels live on a running two-worker cluster: ``celery funnel set`` changes
the admitted rate within a second, ``pause`` stops starts within a second and loses
nothing, ``resume`` and ``unset`` restore the code's limit; the dashboard, in a real
headless Chromium, shows the funnels, charts them and pauses one; without the token its
controls refuse, and a control sent as a GET does nothing. Rates are measured from the
tasks' own start times (``proj.steady``: 20/s in the code), the limit's peak from the
times the workers' gates admitted them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from celery_funnel import Rate, control, prometheus
from celery_funnel._gate.charges import Charge
from celery_funnel._gate.live import Live, series_key
from celery_funnel._limiter.limit import Limit
from celery_funnel._ops.live import LiveThread
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import peak
from tests.integration.conftest import sample
from tests.integration.live_cluster import ROOT, TASK, TOKEN, Cluster, Dashboard, chromium
from tests.integration.proj import runs
from tests.polling import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
# written by every run (build/ is not tracked); the README's docs/dashboard.png is a copy
# of one, made with CELERY_FUNNEL_SCREENSHOT=docs/dashboard.png
SCREENSHOT = Path(ROOT) / (os.environ.get("CELERY_FUNNEL_SCREENSHOT") or "build/dashboard.png")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    try:
        made.workers.start()
        made.workers.wait_ready()
        yield made
    finally:
        made.stop()


@pytest.fixture(autouse=True)
def code_limits_again(cluster: Cluster) -> Iterator[None]:
    """Each test starts from the code's limits, and leaves them: a test that fails with
    a pause in force must not fail the next ones too."""
    yield
    if control.unset(cluster.app, TASK):
        with redis.Redis.from_url(cluster.url) as client:
            store = ParkStore(client, "funnel:")
            wait_for(lambda: not store.counts().get(TASK), 30)


@pytest.fixture(scope="module")
def dashboard(cluster: Cluster) -> Iterator[Dashboard]:
    served = Dashboard(cluster.env)
    try:
        served.wait_ready()
        yield served
    finally:
        served.stop()


def rate(starts: list[float], begin: float, end: float) -> float:
    """Starts per second in [begin, end)."""
    return sum(begin <= at < end for at in starts) / (end - begin)


def _peak_at(times: list[float]) -> float:
    """Where the second with the most of ``times`` begins (epoch seconds)."""
    most = peak(times)
    return next(at for at in times if sum(at <= t < at + 1.0 for t in times) == most)


def test_set_changes_the_admitted_rate_within_a_second_and_unset_restores_it(
    cluster: Cluster, record_property: Any
) -> None:
    cluster.send(range(0, 160))
    wait_for(lambda: len(cluster.starts()) >= 30, 30)
    cluster.cli("set", TASK, "5/s")
    written = control.overrides(cluster.app)[TASK].at  # the override's own time
    time.sleep(3.5)
    _, unset_at, out = cluster.cli("unset", TASK)
    assert "back to the code's limit" in out
    wait_for(lambda: len(cluster.starts()) >= 160, 60)
    starts, admitted = cluster.starts(), cluster.admissions()
    before = rate(starts, written - 1.5, written)
    under = rate(starts, written + 1.0, unset_at - 0.5)
    after = rate(starts, unset_at + 1.0, unset_at + 2.0)
    record_property("rates", {"before": before, "override": under, "after_unset": after})
    most, at = peak(admitted), _peak_at(admitted)
    print(
        f"measured: code 20/s -> {before:.1f}/s; set 5/s -> {under:.1f}/s from 1 s after;"
        f" unset -> {after:.1f}/s from 1 s after; admitted at most {most} in a second, from"
        f" {at - written:.2f} s after set; started at most {peak(starts)} in a second"
    )
    assert 15 <= before <= 22
    assert 3 <= under <= 6.5, "the override's 5/s, from 1 s after it was written"
    assert after >= 14, "the code's 20/s again, 1 s after unset"
    assert len(starts) == 160, "every task ran once"
    # the limit is on admissions, each timed by the gate that made it: a start adds the
    # pool's dispatch delay, which on a loaded machine varies by more than a slot (50 ms)
    assert len(admitted) == 160, "every run admitted once"
    assert most <= 21, (
        f"never above the code's 20/s (capacity 1): {most} admitted in the second from"
        f" {at - written:.2f} s after set, {at - unset_at:.2f} s after unset"
    )


def test_pause_stops_starts_within_a_second_and_resume_runs_every_task_once(
    cluster: Cluster,
) -> None:
    # 6 s of tasks at 20/s: the pause (a CLI run, seconds on a loaded machine) lands
    # while many still wait
    cluster.send(range(1000, 1120))
    wait_for(lambda: len(cluster.starts(1000)) >= 10, 30)
    cluster.cli("pause", TASK)
    written = control.overrides(cluster.app)[TASK].at
    store = ParkStore(redis.Redis.from_url(cluster.url), "funnel:")
    wait_for(lambda: store.counts().get(TASK, 0) > 0, 10)  # waiting tasks park
    time.sleep(2.0)
    paused_starts = cluster.starts(1000)
    resumed, _, _ = cluster.cli("resume", TASK)
    wait_for(lambda: len(cluster.starts(1000)) >= 120, 60)
    starts = cluster.starts(1000)
    late = [at for at in paused_starts if at > written + 1.0]
    first = min(at for at in starts if at > resumed)
    print(
        f"measured: last start {max(paused_starts) - written:.3f} s after the pause was"
        f" written; first start {first - resumed:.3f} s after `resume` was run"
    )
    assert late == [], "no start later than 1 s after the pause"
    assert len(starts) == 120, "nothing lost, nothing run twice"
    recorded = sorted(r["args"][0] for r in runs(cluster.url) if 1000 <= r["args"][0] < 2000)
    assert recorded == list(range(1000, 1120))
    assert 0 < rate(starts, resumed, max(starts) + 1e-3) <= 21


def test_without_the_token_nothing_is_shown_and_the_controls_refuse(
    cluster: Cluster, dashboard: Dashboard
) -> None:
    csrf = {"X-CSRF-Token": "c" * 32, "Cookie": "celery_funnel_csrf=" + "c" * 32}
    json_body = {"Content-Type": "application/json"}
    assert dashboard.request("/api/state")[0] == 401
    assert dashboard.request("/")[0] == 401
    status, _ = dashboard.request("/api/pause/" + TASK, "POST", b"{}", json_body, csrf)
    assert status == 401
    wrong = {"Authorization": "Bearer " + "x" * len(TOKEN)}
    status, _ = dashboard.request("/api/pause/" + TASK, "POST", b"{}", json_body, csrf, wrong)
    assert status == 401
    good = {"Authorization": f"Bearer {TOKEN}"}
    # a GET on a control's URL does nothing, with the token or not
    assert dashboard.request("/api/pause/" + TASK, "GET", None, good)[0] == 405
    assert dashboard.request(f"/api/pause/{TASK}?x=1")[0] == 405
    # the token without the page's CSRF token: refused too
    status, _ = dashboard.request("/api/pause/" + TASK, "POST", b"{}", json_body, good)
    assert status == 403
    assert TASK not in control.overrides(cluster.app), "nothing was paused"
    status, body = dashboard.request(
        "/api/set/" + TASK, "POST", json.dumps({"rate": "7/s"}).encode(),
        json_body, good, csrf,
    )  # fmt: skip
    assert status == 200, body
    assert str(control.overrides(cluster.app)[TASK].rate) == "7/s"
    status, body = dashboard.request("/api/unset/" + TASK, "POST", b"", good, csrf)
    assert (status, json.loads(body)["override"]) == (200, True)
    status, body = dashboard.request(
        "/api/set/" + TASK, "POST", b'{"rate": "fast"}', json_body, good, csrf
    )
    assert status == 400
    assert "invalid rate 'fast'" in body
    assert TASK not in control.overrides(cluster.app)


def test_the_dashboard_refuses_to_start_open_beyond_this_machine(cluster: Cluster) -> None:
    env = {**cluster.env, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "funnel",
         "dashboard", "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "bound to '0.0.0.0'" in done.stderr
    assert "--token" in done.stderr


def test_the_dashboard_in_a_browser_shows_charts_and_pauses_a_funnel(
    cluster: Cluster, dashboard: Dashboard
) -> None:
    from selenium.webdriver.common.by import By

    browser = chromium()
    try:
        browser.get(f"{dashboard.url}/?token={TOKEN}")  # the page keeps it in a cookie
        row = f'tr[data-funnel="{TASK}"]'
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, row), 20)
        cluster.send(range(2000, 2120))  # 6 s of work at 20/s: the pause comes before
        shown = browser.find_element(By.CSS_SELECTOR, "#funnels tbody").text
        assert TASK in shown
        assert "20/s (capacity 1, gcra)" in shown
        plotted = f"return window.cfDashboard.admitted[{json.dumps(TASK)}] || 0"
        wait_for(lambda: browser.execute_script(plotted) >= 1, 20)
        first = browser.execute_script(plotted)
        wait_for(lambda: browser.execute_script(plotted) > first, 10)  # the chart updates
        assert browser.find_elements(By.CSS_SELECTOR, f'div.chart[data-funnel="{TASK}"] canvas')
        button = f'{row} button[data-action="pause"]'
        clicked = time.time()
        browser.find_element(By.CSS_SELECTOR, button).click()
        wait_for(lambda: "PAUSED" in browser.find_element(By.CSS_SELECTOR, row).text, 10)
        paused_at = control.overrides(cluster.app)[TASK].at
        time.sleep(2.5)  # the chart shows the pause; nothing may start
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1500, max(1250, height + 200))  # the table and the charts
        browser.save_screenshot(str(SCREENSHOT))
        during = cluster.starts(2000)
        print(
            f"measured: pause clicked; written {paused_at - clicked:.3f} s after the click;"
            f" last start {max(during) - paused_at:.3f} s after it; {len(during)} of 120 ran"
        )
        assert [at for at in during if at > paused_at + 1.0] == []
        assert len(during) < 120, "the pause stopped starts before every task ran"
        browser.find_element(By.CSS_SELECTOR, f'{row} button[data-action="unset"]').click()
        wait_for(lambda: len(cluster.starts(2000)) >= 120, 60)
    finally:
        browser.quit()
    numbers = sorted(r["args"][0] for r in runs(cluster.url) if r["args"][0] >= 2000)
    assert numbers == list(range(2000, 2120)), "nothing lost, nothing run twice"


def test_status_metrics_and_series_show_overrides_and_parked_counts(cluster: Cluster) -> None:
    client = redis.Redis.from_url(cluster.url)
    control.set_override(cluster.app, TASK, "3/s", capacity=2, ttl="1h")
    control.pause(cluster.app, "proj.limited")
    try:
        _, _, out = cluster.cli("status")
        assert "overrides:" in out
        assert f"{TASK}: code 20/s capacity 1; override rate 3/s, capacity 2; by " in out
        assert "proj.limited: code 10/s capacity 1; override PAUSED; by " in out
        assert "until " in out  # the ttl's end, local time
        registry = CollectorRegistry()
        metrics = prometheus.enable(registry)
        live = Live()
        thread = LiveThread(client, "funnel:", live, "probe@test", dict, lambda changes: None)
        store = ParkStore(client, "funnel:")
        meta = {"funnel": "probe", "task": "probe", "parked_at": time.time()}
        store.park("probe-1", 3600.0, {"body": b"", "meta": meta}, "")
        try:
            live.count(["limit:x", TASK], admitted=True)
            live.count([TASK], admitted=False)
            thread.tick()
        finally:
            metrics.disconnect()
            store.purge("probe")
        assert sample(registry, "celery_funnel_override", funnel=TASK, field="rate") == 3.0
        assert sample(registry, "celery_funnel_override", funnel=TASK, field="capacity") == 2.0
        assert (
            sample(registry, "celery_funnel_override", funnel="proj.limited", field="paused") == 1
        )
        assert sample(registry, "celery_funnel_parked", funnel="probe") == 1
        assert live.overrides.paused([Charge(Limit(Rate.parse("1/s")), "k", 1, "proj.limited")])
        fields: dict[str, int] = {}
        for minute in (int(time.time()) // 60 - 1, int(time.time()) // 60):
            for field, value in client.hgetall(series_key("funnel:", minute)).items():
                text = field.decode() if isinstance(field, bytes) else field
                label, _, kind = text.rsplit("|", 2)
                fields[f"{label}|{kind}"] = fields.get(f"{label}|{kind}", 0) + int(value)
        assert fields.get(f"{TASK}|a", 0) >= 1
        assert fields.get(f"{TASK}|r", 0) >= 1
        assert fields.get("limit:x|a") == 1
    finally:
        control.unset(cluster.app, TASK)
        control.unset(cluster.app, "proj.limited")
        client.close()
    assert control.overrides(cluster.app) == {}


def test_a_pause_with_a_ttl_ends_by_itself_and_releases_its_parked_tasks(
    cluster: Cluster,
) -> None:
    control.pause(cluster.app, TASK, ttl=2.0)
    ends = control.overrides(cluster.app)[TASK].expires_at
    assert ends is not None
    time.sleep(0.6)
    cluster.send(range(3000, 3010))
    store = ParkStore(redis.Redis.from_url(cluster.url), "funnel:")
    wait_for(lambda: store.counts().get(TASK, 0) == 10, 10)  # all parked, none ran
    assert cluster.starts(3000) == []
    wait_for(lambda: len(cluster.starts(3000)) == 10, 20)
    starts = cluster.starts(3000)
    print(f"measured: first start {starts[0] - ends:.3f} s after the pause's ttl ended")
    assert starts[0] >= ends
    assert starts[0] - ends < 5.0, "released when the pause ended, not after 60 s"
    assert control.overrides(cluster.app) == {}, "the expired override is gone"
