"""The docs' tables list what is there, and say it in the glossary's words (issue 55,
item 6): the README's documentation table every page of the site, the quickstart's
examples table every example, the reference's pointers to other pages real links, and
no page the word "re-queue(d)" (held, parked or republished: docs/architecture.md)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _nav_pages() -> set[str]:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages: set[str] = set()

    def walk(items: list[object]) -> None:
        for item in items:
            for value in item.values() if isinstance(item, dict) else [item]:
                if isinstance(value, list):
                    walk(value)
                else:
                    pages.add(str(value))

    walk(nav)
    return pages


def test_the_readme_documentation_table_lists_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Documentation") :]
    table = table[: table.index("\n\n", table.index("| page"))]
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", table))
    # the home page is the README itself; the full benchmark tables hang off benchmarks.md;
    # the changelog is linked at the root (CHANGELOG.md)
    wanted = _nav_pages() - {"index.md", "benchmarks-full.md", "changelog.md"}
    assert wanted - linked == set(), "pages missing from the README's table"
    assert "](CHANGELOG.md)" in table


def test_the_quickstart_lists_every_example() -> None:
    page = (DOCS / "quickstart.md").read_text()
    table = page[page.index("| example | shows |") :]
    table = table[: table.index("\n\n")]
    listed = set(re.findall(r"^\| `(\w+)\.py` \|", table, re.M))
    examples = {p.stem for p in (ROOT / "examples").glob("*.py") if not p.stem.startswith("_")}
    assert listed == examples


def test_the_reference_points_to_other_pages_with_links() -> None:
    reference = (DOCS / "reference.md").read_text()
    plain = re.findall(r"docs/[\w-]+\.md", reference.split("-->", 1)[1])
    assert plain == [], "a page named as text, not linked"
    assert "](debounce.md)" in reference
    assert "](llm.md)" in reference


def test_no_page_says_re_queue() -> None:
    pages = [ROOT / "README.md", *DOCS.glob("*.md")]
    said = [p.name for p in pages if re.search(r"re-queue", p.read_text(), re.I)]
    assert said == [], "held, parked or republished: the glossary's words"
