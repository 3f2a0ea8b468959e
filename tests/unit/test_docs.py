"""The docs: the options and settings reference (docs/reference.md) names every option
and setting the code knows, and is the file ``python3 dev.py docs`` writes from the code's
tables; the README stays a front page (at most 350 lines, its first runnable Python
within its first 60)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import celery_funnel
from celery_funnel._config import options, settings
from celery_funnel._config.reference import OPTION_HELP, SETTING_HELP, anchor, render

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"


def test_every_option_and_setting_has_a_line() -> None:
    assert set(OPTION_HELP) == set(options.OPTIONS)
    assert set(SETTING_HELP) == set(settings._DEFAULTS)


def test_the_reference_names_every_option_and_setting() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    rows = [(name, name) for name in options.OPTIONS]
    rows += [(name, anchor(name, setting=True)) for name in settings._DEFAULTS]
    missing = [
        name
        for name, ident in rows
        if f'| <a class="cf-name" id="{ident}" href="#{ident}"><code>{name}</code></a> |'
        not in text
    ]
    assert not missing, f"docs/reference.md misses {missing}: run python3 dev.py docs"


def test_every_option_and_setting_has_its_own_anchor() -> None:
    """``reference.md#funnel_max_waiting`` is the option's row; a setting named as an
    option is ``#setting-<name>``; no id is given twice."""
    ids = re.findall(r' id="([^"]+)"', REFERENCE.read_text(encoding="utf-8"))
    assert len(ids) == len(set(ids)) == len(options.OPTIONS) + len(settings._DEFAULTS)
    assert "funnel_max_waiting" in ids
    assert "funnel_redis_url" in ids
    assert {"setting-funnel_limits", "funnel_limits"} <= set(ids)


def test_search_finds_words_inside_identifiers() -> None:
    """mkdocs.yml's search splits on ``_`` (and ``.``, ``/``, ...): "waiting" and
    "max_waiting" find ``funnel_max_waiting``."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    separator = re.search(r"^\s+separator: '(.+)'$", config, re.MULTILINE)
    assert separator, "mkdocs.yml: plugins: - search: separator"
    words = set(re.split(separator.group(1), "`funnel_max_waiting` (celery_funnel.Rate) 0.5/s"))
    assert {"funnel", "max", "waiting", "Rate", "0.5", "s"} <= words


def test_no_page_doubles_the_heading_of_the_snippet_it_includes() -> None:
    """A page that includes a README section (``--8<-- "README.md:name"``) does not
    repeat the section's heading: the Quickstart page was "# Quickstart" then
    "## Quickstart"."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for section in re.findall(r'^--8<-- "README\.md:(\w+)"$', text, re.MULTILINE):
            start = readme.index(f"<!-- --8<-- [start:{section}] -->")
            part = readme[start : readme.index(f"<!-- --8<-- [end:{section}] -->")]
            own = {h.lstrip("# ").lower() for h in re.findall(r"^#+ .+$", text, re.MULTILINE)}
            theirs = {h.lstrip("# ").lower() for h in re.findall(r"^#+ .+$", part, re.MULTILINE)}
            assert not own & theirs, f"{page.name} repeats {own & theirs} from README.md"


def test_the_reference_is_the_generated_one() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == render(), "run python3 dev.py docs"


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 350
    first = lines.index("```python")
    assert first < 60
    compile("\n".join(lines[first + 1 : lines.index("```", first)]), "README.md", "exec")


def test_the_sample_configuration_error_is_the_real_one(tmp_path: Path) -> None:
    """docs/configuration.md's misspelled option, run: the same message, and the frames
    the page says (the user's line, then celery-funnel's check)."""
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    start = page.index("Example: a misspelled option")
    code = page[
        page.index("```python\n", start) + 10 : page.index(
            "```", page.index("```python\n", start) + 10
        )
    ]
    said = page[
        page.index("```\nTraceback", start) + 4 : page.index(
            "\n```", page.index("```\nTraceback", start) + 4
        )
    ]
    source = "from celery import Celery\n\nfrom celery_funnel import FunnelTask, install\n\n"
    source += 'app = install(Celery("tasks"))\n\n\n' + code
    (tmp_path / "tasks.py").write_text(source, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "tasks.py"], capture_output=True, text=True, cwd=tmp_path, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    real = done.stderr.strip().splitlines()
    assert real[-1] == said.splitlines()[-1]
    files = [line.split('"')[1] for line in real if line.startswith("  File ")]
    assert files[0].endswith("tasks.py")
    assert len(files) == 3
    assert all("/celery_funnel/" in f for f in files[1:]), files
    assert (
        f'  File "tasks.py", line {source.count(chr(10), 0, source.index("@app.task")) + 1}' in said
    )


def test_the_api_reference_has_every_public_name() -> None:
    """docs/api.md renders each name of ``celery_funnel.__all__`` from its docstrings
    (mkdocstrings' ``::: celery_funnel.Name``), and nothing that is not public."""
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    rendered = re.findall(r"^::: celery_funnel\.(\w+)$", page, re.MULTILINE)
    assert sorted(rendered) == sorted(celery_funnel.__all__)
    assert "::: celery_funnel._limiter.guard.limit_method" in page  # Funnel.limit's docs
