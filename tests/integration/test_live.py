"""Operating funnels live on a running two-worker cluster: ``celery funnel set`` changes
the admitted rate within a second, ``pause`` stops starts within a second and loses
nothing, ``resume`` and ``unset`` restore the code's limit; the dashboard, in a real
headless Chromium, shows the funnels, charts them and pauses one; without the token its
controls refuse, and a control sent as a GET does nothing.

What a limit does is read from the funnel's own decisions, on Redis's clock
(``tests.redis_monitor``): each one moves ``proj.steady``'s funnel (20/s in the code,
capacity 1) one slot, 50 ms at 20/s, 200 ms at 5/s, so the rate each decision was made
at is known exactly, whatever the load; start times add the pool's dispatch delay,
which a loaded machine stretches by seconds. How soon an override applies (the live
thread's refresh, 0.5 s) is printed, and checked only as a hang."""

from __future__ import annotations

import itertools
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
from celery_funnel._limiter.keys import task_key
from celery_funnel._limiter.limit import Limit
from celery_funnel._ops.live import LiveThread
from celery_funnel._stores.park import ParkStore
from celery_funnel.testing import peak
from tests.integration.conftest import sample
from tests.integration.live_cluster import ROOT, TASK, TOKEN, Cluster, Dashboard, chromium
from tests.integration.proj import runs
from tests.polling import wait_for
from tests.redis_monitor import FunnelLog, Write, funnel_log

pytestmark = [pytest.mark.redis, pytest.mark.slow]
# written by every run (build/ is not tracked); the README's docs/dashboard.png is a copy
# of one, made with CELERY_FUNNEL_SCREENSHOT=docs/dashboard.png
SCREENSHOT = Path(ROOT) / (os.environ.get("CELERY_FUNNEL_SCREENSHOT") or "build/dashboard.png")
KEY = task_key("funnel:", TASK)  # its funnel: the TAT, as every decision moves it
FAST, SLOW = 0.05, 0.2  # the slot of the code's 20/s and of the override's 5/s
# what one connection (one worker's) may decide at, in order, around set and unset
ORDERS = ([FAST], [SLOW], [FAST, SLOW], [SLOW, FAST], [FAST, SLOW, FAST])


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


def paces(log: FunnelLog) -> list[tuple[Write, float]]:
    """Each decision on TASK's funnel that moved it forward (admitted, or a slot booked;
    not a booking given back), in order, with the slot it moved it (the nearer of FAST
    and SLOW): the rate it was decided at."""
    return [
        (w, FAST if moved < (FAST + SLOW) / 2 else SLOW)
        for w, moved in log.steps(KEY)
        if moved > FAST / 2
    ]


def once_each(cluster: Cluster, first: int, count: int) -> None:
    """Every task numbered ``first`` .. ``first + count - 1`` ran, once."""
    numbers = sorted(
        r["args"][0] for r in runs(cluster.url)
        if r["name"] == TASK and first <= r["args"][0] < first + 1000
    )  # fmt: skip
    assert numbers == list(range(first, first + count)), "nothing lost, nothing run twice"


def ran(cluster: Cluster, first: int, count: int) -> bool:
    return len(cluster.starts(first, first + 1000)) >= count


def test_set_changes_the_admitted_rate_and_unset_restores_it(
    cluster: Cluster, record_property: Any
) -> None:
    """160 tasks: ``set 5/s`` while they run, then ``unset``. Every decision before the
    override was written is at 20/s; each worker's connection switches to 5/s once and
    back once (20/s, 5/s, 20/s in that order), every 5/s decision lies between the
    override's write and the end of ``unset``; the last ones are at 20/s again; and the
    slots, on Redis's clock, never come closer than the rate in force."""
    with funnel_log(cluster.url, KEY) as log:
        cluster.send(range(0, 160))
        wait_for(lambda: ran(cluster, 0, 30), 60)
        cluster.cli("set", TASK, "5/s")
        written = control.overrides(cluster.app)[TASK].at  # the override's own time
        wait_for(lambda: sum(pace == SLOW for _, pace in paces(log)) >= 5, 60)
        unsetting, unset_at, out = cluster.cli("unset", TASK)
        assert "back to the code's limit" in out
        wait_for(lambda: ran(cluster, 0, 160), 120)
    decided = paces(log)
    slow = [w for w, pace in decided if pace == SLOW]
    first_slow, last_slow = min(w.at for w in slow), max(w.at for w in slow)
    record_property("applied_after", {"set": first_slow - written, "unset": last_slow - unsetting})
    print(
        f"measured: {len(decided)} decisions, {len(slow)} at 5/s: the first"
        f" {first_slow - written:.3f} s after `set` was written, the last"
        f" {last_slow - unsetting:.3f} s after `unset` began (Redis's clock); started at"
        f" most {peak(cluster.starts(0, 1000))} in a second"
    )
    once_each(cluster, 0, 160)
    assert len(decided) >= 160, "a decision (admitted, or a slot booked) for every run"
    assert [pace for w, pace in decided if w.at < written] == [FAST] * sum(
        w.at < written for w, _ in decided
    ), "20/s until the override was written"
    assert all(written <= w.at <= unset_at for w in slow), "5/s only while it was in force"
    for caller in {w.caller for w, _ in decided}:
        mine = [pace for pace, _ in itertools.groupby(p for w, p in decided if w.caller == caller)]
        assert mine in ORDERS, f"{caller} decided at 20/s, 5/s, 20/s in this order: {mine}"
    assert decided[-1][1] == FAST, "back to the code's 20/s after unset"
    assert any(w.at > last_slow and pace == FAST for w, pace in decided)


def test_pause_stops_admissions_and_resume_runs_every_task_once(
    cluster: Cluster, record_property: Any
) -> None:
    """120 tasks (6 s at 20/s): ``pause`` while they run parks the waiting ones; no
    decision on the funnel from 1 s after the pause was written until ``resume`` (on
    Redis's clock; the live thread refreshes a paused funnel every 0.15 s); then every
    task runs, once, at the code's rate."""
    with funnel_log(cluster.url, KEY) as log:
        cluster.send(range(1000, 1120))
        wait_for(lambda: ran(cluster, 1000, 10), 60)
        cluster.cli("pause", TASK)
        written = control.overrides(cluster.app)[TASK].at
        with redis.Redis.from_url(cluster.url) as client:
            store = ParkStore(client, "funnel:")
            wait_for(lambda: store.counts().get(TASK, 0) > 0, 30)  # waiting tasks park
        time.sleep(2.0)  # paused for 2 s at least: nothing may be decided
        resuming, _, _ = cluster.cli("resume", TASK)
        wait_for(lambda: ran(cluster, 1000, 120), 120)
    decided = paces(log)
    during = [w.at - written for w, _ in decided if written <= w.at < resuming]
    record_property("last_decision_after_pause", max(during, default=0.0))
    print(
        f"measured: last decision {max(during, default=0.0):.3f} s after the pause was"
        f" written (Redis's clock); {len(decided)} decisions"
    )
    assert [at for at in during if at > 1.0] == [], "no decision later than 1 s after it"
    once_each(cluster, 1000, 120)
    assert {pace for w, pace in decided} == {FAST}, "at the code's 20/s, before and after"


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
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, row), 30)
        with funnel_log(cluster.url, KEY) as log:
            cluster.send(range(2000, 2120))  # 6 s of work at 20/s: the pause comes before
            shown = browser.find_element(By.CSS_SELECTOR, "#funnels tbody").text
            assert TASK in shown
            assert "20/s (capacity 1, gcra)" in shown
            plotted = f"return window.cfDashboard.admitted[{json.dumps(TASK)}] || 0"
            wait_for(lambda: browser.execute_script(plotted) >= 1, 30)
            first = browser.execute_script(plotted)
            wait_for(lambda: browser.execute_script(plotted) > first, 30)  # the chart updates
            assert browser.find_elements(By.CSS_SELECTOR, f'div.chart[data-funnel="{TASK}"] canvas')
            button = f'{row} button[data-action="pause"]'
            clicked = time.time()
            browser.find_element(By.CSS_SELECTOR, button).click()
            wait_for(lambda: "PAUSED" in browser.find_element(By.CSS_SELECTOR, row).text, 30)
            paused_at = control.overrides(cluster.app)[TASK].at
            time.sleep(2.5)  # the chart shows the pause; nothing may be decided
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(SCREENSHOT))
            log.sync()
            during = [w.at - paused_at for w, _ in paces(log) if w.at >= paused_at]
            started = len(cluster.starts(2000, 3000))
            print(
                f"measured: pause clicked; written {paused_at - clicked:.3f} s after the click;"
                f" last decision {max(during, default=0.0):.3f} s after it (Redis's clock);"
                f" {started} of 120 ran"
            )
            assert [at for at in during if at > 1.0] == [], "no decision 1 s after the pause"
            assert started < 120, "the pause stopped runs before every task ran"
            browser.find_element(By.CSS_SELECTOR, f'{row} button[data-action="unset"]').click()
            wait_for(lambda: ran(cluster, 2000, 120), 120)
    finally:
        browser.quit()
    once_each(cluster, 2000, 120)


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
    """Paused for 6 s: 10 tasks sent meanwhile park (none runs); they run once it has
    ended (released then, not by their 60 s re-check), and the expired override is
    gone."""
    control.pause(cluster.app, TASK, ttl=6.0)
    ends = control.overrides(cluster.app)[TASK].expires_at
    assert ends is not None
    time.sleep(0.6)  # every worker's live thread has read the pause (0.5 s refresh)
    cluster.send(range(3000, 3010))
    with redis.Redis.from_url(cluster.url) as client:
        store = ParkStore(client, "funnel:")
        wait_for(lambda: store.counts().get(TASK, 0) == 10, 60)  # all parked, none ran
    assert cluster.starts(3000, 4000) == []
    wait_for(lambda: ran(cluster, 3000, 10), 120)
    starts = cluster.starts(3000, 4000)
    print(f"measured: first start {starts[0] - ends:.3f} s after the pause's ttl ended")
    assert starts[0] >= ends
    # a hang, not a speed: parked for a pause, they are checked again after 60 s
    assert starts[0] - ends < 30.0, "released when the pause ended, not after 60 s"
    once_each(cluster, 3000, 10)
    assert control.overrides(cluster.app) == {}, "the expired override is gone"
