"""Every module a docstring, a comment or a page of docs/ names exists: a path
(``_gate/held.py``, ``celery_funnel/_celery/worker.py``, ``lua/reserve.lua``), a dotted
name (``_shared.judge``, ``celery_funnel._stores.park.ParkStore``) or a private module's
name alone (``_chain``). The package was laid out again more than once; a name from an
older layout sends a reader to a file that is not there."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_funnel"
DOCS = ROOT / "docs"


def _files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    return listed or [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]


FILES = _files()
DIRS = {str(Path(f).parent) for f in FILES}
BASENAMES = {Path(f).name for f in FILES}


def _module(path: str) -> str:
    """``celery_funnel/_shared/judge.py`` -> ``_shared.judge`` (the package itself: "")."""
    parts = Path(path).relative_to("celery_funnel").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# the package's modules by dotted name below celery_funnel ("_shared.judge", "_gate", "")
MODULES = {_module(f) for f in FILES if f.startswith("celery_funnel/") and f.endswith(".py")}
MODULE_BASENAMES = {m.rpartition(".")[2] for m in MODULES}
# names that appear as identifiers anywhere in the package's code
PACKAGE_NAMES: set[str] = set()

PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:py|lua|md))(?![\w:])")
DIRECTORY = re.compile(r"(?<![\w./-])((?:celery_funnel/)?_\w+(?:/\w+)*/)(?![\w.])")
DOTTED = re.compile(r"(?<![\w./-])(celery_funnel(?:\.\w+)+|_[A-Za-z]\w*(?:\.\w+)+)")
QUOTED = re.compile(r"(?:``|`|\()(_[A-Za-z]\w*)(?:``|`|\))")


def _path_exists(path: str) -> bool:
    if "/" not in path:
        return path in BASENAMES
    path = path.removeprefix("./")
    return any(f == path or f.endswith("/" + path) for f in FILES)


def _directory_exists(path: str) -> bool:
    path = path.rstrip("/")
    return any(d == path or d.endswith("/" + path) for d in DIRS)


def _bound(targets: list[ast.expr]) -> Iterator[str]:
    for target in targets:
        if isinstance(target, ast.Name):
            yield target.id
        elif isinstance(target, ast.Tuple):
            yield from _bound(list(target.elts))


def _members(body: list[ast.stmt]) -> dict[str, set[str] | None]:
    """The names a module (or class) body binds: a class's to the names of its own
    body, any other to None (what it holds is not read)."""
    found: dict[str, set[str] | None] = {}
    for node in body:
        if isinstance(node, ast.ClassDef):
            found[node.name] = set(_members(node.body))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = None
        elif isinstance(node, ast.Assign):
            found.update(dict.fromkeys(_bound(node.targets)))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            found.update(dict.fromkeys(_bound([node.target])))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.update(dict.fromkeys((a.asname or a.name).split(".")[0] for a in node.names))
        elif isinstance(node, ast.If | ast.Try):
            found.update(_members(node.body + node.orelse))
    return found


def _module_members(module: str) -> dict[str, set[str] | None]:
    path = PACKAGE.joinpath(*module.split(".")) if module else PACKAGE
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return _members(ast.parse(path.read_text(encoding="utf-8")).body)


def _dotted_exists(dotted: str, names: set[str]) -> bool | None:
    """Whether ``dotted`` names a module (and attributes of it) of the package; None
    when it does not look like a module's name at all."""
    parts = dotted.removeprefix("celery_funnel.").split(".")
    explicit = dotted.startswith("celery_funnel.")
    modules = [m for m in MODULES if m == parts[0] or m.endswith("." + parts[0])]
    if explicit and not modules:
        modules, parts = [""], ["", *parts]  # a name of the package itself
    if not modules:
        if explicit or parts[0] in {m.split(".")[0] for m in MODULES if m}:
            return False
        if not parts[0].startswith("_") or parts[0] in names:
            return None  # an attribute or a local name, not a module
        return False
    for base in modules:
        found = base.split(".") if base else []
        rest = parts[1:]
        while rest and ".".join([*found, rest[0]]) in MODULES:
            found.append(rest.pop(0))
        # read, not imported: importing every module would set up the demo's app
        members: dict[str, set[str] | None] | None = _module_members(".".join(found))
        for name in rest:
            if members is None:
                return True  # an attribute of what a name holds: not read
            if name not in members:
                break
            inner = members[name]
            members = None if inner is None else dict.fromkeys(inner)
        else:
            return True
    return False


def _code_names(source: str) -> set[str]:
    names = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME:
            names.add(token.string)
    return names


def _python_texts(source: str) -> Iterator[tuple[int, str]]:
    """A module's docstrings (every string statement) and comments, with their lines."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.lineno, node.value.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def _lua_texts(source: str) -> Iterator[tuple[int, str]]:
    for n, line in enumerate(source.splitlines(), 1):
        if "--" in line:
            yield n, line[line.index("--") :]


def _markdown_texts(source: str) -> Iterator[tuple[int, str]]:
    """A page's lines outside fenced code blocks (those show a user's code)."""
    fenced = False
    for n, line in enumerate(source.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield n, line


def _stale(text: str, names: set[str], markdown: bool) -> Iterator[str]:
    for match in PATH.finditer(text):
        path = match.group(1)
        if path.endswith(".md") and not markdown:
            continue
        if markdown and "/" not in path and not path.startswith("_"):
            continue  # a user's file in an example (tasks.py, celery.py)
        if not _path_exists(path):
            yield path
    for match in DIRECTORY.finditer(text):
        if not _directory_exists(match.group(1)):
            yield match.group(1)
    for match in DOTTED.finditer(text):
        dotted = match.group(1)
        if re.search(r"\.(py|lua|md|toml|txt|json|yml|html)$", dotted):
            continue
        if _dotted_exists(dotted, names) is False:
            yield dotted
    for match in QUOTED.finditer(text):
        name = match.group(1)
        if name in names or name in MODULE_BASENAMES or name in MODULES:
            continue
        yield name


def _sources() -> Iterator[tuple[str, str, bool]]:
    for path in sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.rglob("*.lua")):
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"), False
    for path in sorted(DOCS.glob("*.md")):
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"), True


def _stale_references() -> list[str]:
    if not PACKAGE_NAMES:
        for path in PACKAGE.rglob("*.py"):
            PACKAGE_NAMES.update(_code_names(path.read_text(encoding="utf-8")))
    found = []
    for where, source, markdown in _sources():
        if where.endswith(".py"):
            names, texts = _code_names(source), _python_texts(source)
        elif where.endswith(".lua"):
            names, texts = set(), _lua_texts(source)
        else:
            names, texts = PACKAGE_NAMES, _markdown_texts(source)
        for first, text in texts:
            for n, line in enumerate(text.splitlines(), first):
                found += [f"{where}:{n}: {name}" for name in _stale(line, names, markdown)]
    return sorted(set(found))


def test_every_named_module_exists() -> None:
    stale = _stale_references()
    assert not stale, "names of modules that are not there:\n" + "\n".join(stale)


@pytest.mark.parametrize(
    ("text", "stale"),
    [
        ("see ``_gate/held.py``", []),
        ("see ``_gate/hold.py``", ["_gate/hold.py"]),
        ("by ``_limiter/lua/reserve.lua``", ["_limiter/lua/reserve.lua"]),
        ("``lua/reserve.lua``", []),
        ("``_shared.judge.decide``", []),
        ("``celery_funnel._stores.park``", []),
        ("``_gate.judged``", ["_gate.judged"]),
        ("(``_park``)", ["_park"]),
        ("(_chain)", []),
        ("``_fair_gate.Dispatcher``", ["_fair_gate.Dispatcher"]),
        ("``_celery.dispatch.Dispatcher``", []),
        ("``_celery.dispatch.Dispatch``", ["_celery.dispatch.Dispatch"]),
        ("``_config.runtime.Runtime.redis_options``", []),
        ("``celery_funnel.FunnelTask``", []),
        ("``celery_funnel.NoSuchName``", ["celery_funnel.NoSuchName"]),
    ],
)
def test_the_check_sees_a_stale_name(text: str, stale: list[str]) -> None:
    assert list(_stale(text, set(), markdown=False)) == stale
