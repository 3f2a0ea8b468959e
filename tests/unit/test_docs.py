"""The docs: the options and settings reference (docs/reference.md) names every option
and setting the code knows, and is the file ``python3 dev.py docs`` writes from the code's
tables; the README stays a front page (at most 350 lines, its first runnable Python
within its first 60)."""

from __future__ import annotations

from pathlib import Path

from celery_funnel._config import options, settings
from celery_funnel._config.reference import OPTION_HELP, SETTING_HELP, render

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"


def test_every_option_and_setting_has_a_line() -> None:
    assert set(OPTION_HELP) == set(options.OPTIONS)
    assert set(SETTING_HELP) == set(settings._DEFAULTS)


def test_the_reference_names_every_option_and_setting() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    missing = [
        name for name in (*options.OPTIONS, *settings._DEFAULTS) if f"| `{name}` |" not in text
    ]
    assert not missing, f"docs/reference.md misses {missing}: run python3 dev.py docs"


def test_the_reference_is_the_generated_one() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == render(), "run python3 dev.py docs"


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 350
    first = lines.index("```python")
    assert first < 60
    compile("\n".join(lines[first + 1 : lines.index("```", first)]), "README.md", "exec")
