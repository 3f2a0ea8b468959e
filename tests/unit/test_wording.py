"""One word for a task that waits: "deferred", in the dashboard, the CLI and the docs.
The dashboard's second column counts deferrals (a burst that all ran showed as a red
"refused/s" spike)."""

from __future__ import annotations

import re
from pathlib import Path

from celery_funnel._cli.control import pause

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "celery_funnel" / "dashboard"
# what a waiting task was called here and there, in user-facing text
OTHER_WORDS = re.compile(r"refused/s|\b(postponed|delayed) task", re.IGNORECASE)


def test_the_dashboard_counts_deferrals_as_deferred() -> None:
    page = (DASHBOARD / "page.html").read_text(encoding="utf-8")
    script = (DASHBOARD / "static" / "dashboard.js").read_text(encoding="utf-8")
    assert ">deferred/s</th>" in page
    assert 'label: "deferred/s"' in script
    assert "#c62828" not in script  # not the colour of an error


def test_user_facing_text_says_deferred() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += [DASHBOARD / "page.html", DASHBOARD / "static" / "dashboard.js"]
    found = [
        f"{page.name}: {match.group(0)}"
        for page in pages
        for match in OTHER_WORDS.finditer(page.read_text(encoding="utf-8"))
    ]
    assert not found
    assert "deferred tasks are parked" in (pause.help or "")
