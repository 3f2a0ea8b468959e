"""One word for a task that waits: "deferred", in the dashboard, the CLI and the docs.
The dashboard's second column counts deferrals (a burst that all ran showed as a red
"refused/s" spike). And the code speaks the glossary: no private identifier is a retired
word or a word in a retired sense (``step`` for a ``Ruling``, ``slot`` for a seat,
``release`` for freeing a seat, ``Held`` for the units an allowance took), and every
home the glossary names defines the name it gives."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

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


# --- The code speaks the glossary (docs/architecture.md, "Glossary") --------------------
# Private identifiers are held to it: a retired word, or a word in a retired sense, is
# not a name the package binds (a function, class, argument, variable, attribute, alias),
# and the names the glossary gives each idea are the code's.

PACKAGE = ROOT / "celery_funnel"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# where "step" is a Celery bootstep, the only sense the glossary keeps
BOOTSTEPS = {"_celery/worker.py", "_ops/live.py", "_ops/summary.py", "_install.py"}
# where "slot" is a GCRA booking's time or a Redis Cluster hash slot, its only senses
SLOTS = {
    "_limiter/strategies/reservation.py", "_limiter/backends/redis.py",
    "_limiter/backends/_chain.py", "_stores/fair.py", "_stores/give_back.py",
    "_cli/commands.py",
}  # fmt: skip
# names the glossary retired: the concurrency funnel's former names and their parts
RETIRED_NAMES = {
    "SlotFunnel", "SlotFunnels", "Seats", "LeaseStore", "Leases", "leases_for",
    "lease_funnels", "lease_rows", "release_lease", "slot_funnels", "slot_funnels_of",
    "lease_keys",
}  # fmt: skip
STEP = re.compile(r"(?:^|_)steps?(?:_|$)|(?<=[a-z])Steps?(?=[A-Z]|$)|^Steps?(?=[A-Z]|$)")
FREEING = re.compile(r"(?i)release.*(?:lease|seat|slot)|(?:lease|seat|slot).*release")


def _bound(path: Path) -> Iterator[tuple[int, str, str]]:
    """The names a module binds: (line, name, what binds it)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.lineno, node.name, "def"
        elif isinstance(node, ast.ClassDef):
            yield node.lineno, node.name, "class"
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg, "argument"
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.lineno, node.id, "name"
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.lineno, node.attr, "attribute"
        elif isinstance(node, ast.alias) and node.asname:
            yield node.lineno, node.asname, "alias"


def _sources() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE)), path


def retired_words(package: Path = PACKAGE) -> dict[str, list[str]]:
    """Per retired word or sense, where the package binds it ("module:line: name")."""
    found: dict[str, list[str]] = {
        "step (only a bootstep)": [], "slot (only a booking or a Cluster slot)": [],
        "release (freeing a seat)": [], "Held (only the timer hold)": [],
        "retired names": [],
    }  # fmt: skip
    for path in sorted(package.rglob("*.py")):
        where = str(path.relative_to(package))
        concurrency = "concurrency" in path.name
        for line, name, how in _bound(path):
            at = f"{where}:{line}: {name}"
            if STEP.search(name) and where not in BOOTSTEPS and not name.endswith("Step"):
                found["step (only a bootstep)"].append(at)
            if "slot" in name.lower() and (concurrency or where not in SLOTS):
                found["slot (only a booking or a Cluster slot)"].append(at)
            freeing = concurrency and how == "def" and "release" in name.lower()
            if freeing or FREEING.search(name):
                found["release (freeing a seat)"].append(at)
            if name == "Held" and not (where == "_gate/held.py" and how == "class"):
                found["Held (only the timer hold)"].append(at)
            if name in RETIRED_NAMES:
                found["retired names"].append(at)
    return found


def test_private_identifiers_use_no_retired_word() -> None:
    found = {word: places for word, places in retired_words().items() if places}
    assert not found, f"retired words bound in the package: {found}"


@pytest.mark.parametrize(
    ("source", "word"),
    [
        ("def go(step):\n    pass\n", "step (only a bootstep)"),
        ("paused_step = 1\n", "step (only a bootstep)"),
        ("class FairStep:\n    pass\n", None),  # a bootstep class
        ("slot_funnel = 1\n", "slot (only a booking or a Cluster slot)"),
        ("Held = tuple[int, int]\n", "Held (only the timer hold)"),
        ("def release_seat():\n    pass\n", "release (freeing a seat)"),
        ("class LeaseStore:\n    pass\n", "retired names"),
        ("released = 1\n", None),
    ],
)
def test_the_check_sees_a_retired_word(tmp_path: Path, source: str, word: str | None) -> None:
    (tmp_path / "m.py").write_text(source, encoding="utf-8")
    found = {w for w, places in retired_words(tmp_path).items() if places}
    assert found == ({word} if word else set())


def test_freeing_a_seat_is_free_in_every_layer_of_concurrency() -> None:
    """In concurrency's modules no function is named for a release: a seat is freed."""
    store = {name for _, name, how in _bound(PACKAGE / "_stores" / "concurrency.py")}
    assert {"take", "queue", "free", "renew"} <= store
    gate = {name for _, name, how in _bound(PACKAGE / "_gate" / "concurrency.py") if how == "def"}
    assert {"of", "take", "started", "free", "wait"} <= gate, "the gate's one entry"


def test_one_renewal_type() -> None:
    """``Renewal`` is one type (the renewal service's, as the gate sees it); what one
    renewal call found is ``Renewed``."""
    defined = [
        f"{where}: {name}"
        for where, path in _sources()
        for _, name, how in _bound(path)
        if how == "class" and name == "Renewal"
    ]
    assert defined == ["_gate/concurrency_services.py: Renewal"]


GLOSSARY_HOME = re.compile(r"`(_\w+(?:/\w+)*\.py)` \(([^)]*)\)")
IDENTIFIER = re.compile(r"`([A-Za-z_]\w*)`")


def _glossary_homes() -> list[tuple[str, str]]:
    """(module, name) for every "`module.py` (`Name`)" of the glossary's tables."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    glossary = text[text.index("## Glossary") : text.index("### Kept for compatibility")]
    return [
        (module, name)
        for module, inside in GLOSSARY_HOME.findall(glossary)
        for name in IDENTIFIER.findall(inside)
    ]


def test_the_glossarys_words_are_the_codes() -> None:
    """Every name the glossary gives an idea's home is defined there."""
    homes = _glossary_homes()
    assert len(homes) >= 25
    missing = []
    for module, name in homes:
        path = PACKAGE / module
        names = {n for _, n, how in _bound(path) if how in ("def", "class", "name")}
        if name not in names:
            missing.append(f"{module}: {name}")
    assert not missing, f"the glossary names what the code does not define: {missing}"
