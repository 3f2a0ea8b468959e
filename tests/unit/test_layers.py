"""The house keeps its shape: every import in the package (lazy and ``TYPE_CHECKING``
ones included) runs from a higher layer to a lower one or stays inside its part, and no
module imports itself round about. ``LAYERS`` is the table in docs/architecture.md."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "celery_funnel"

# top-level part -> rank: a part may import only parts of a lower rank
LAYERS = {
    "_limiter": 0,
    "signals": 0,
    "_stores": 1,
    "_transport": 1,
    "transport": 2,
    "testing": 1,
    "prometheus": 1,
    "_config": 2,
    "_shared": 3,
    "_gate": 4,
    "_celery": 5,
    "_ops": 6,
    "control": 7,
    "dashboard": 8,
    "_install": 8,
    "demo": 9,
    "_cli": 10,
    "": 10,  # the package's __init__
    "__main__": 11,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that module ``name`` imports."""
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            targets = [
                f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                for a in node.names
            ]
        else:
            continue
        for imported in targets:
            target = imported
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def part(module: str) -> str:
    """The top-level part a module belongs to ("" for the package itself)."""
    return module.split(".")[1] if "." in module else ""


def test_every_part_has_a_layer() -> None:
    assert {part(m) for m in MODULES} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_only_downward(module: str) -> None:
    upward = [
        target for target in GRAPH[module]
        if part(target) != part(module) and LAYERS[part(target)] >= LAYERS[part(module)]
    ]  # fmt: skip
    assert not upward, f"{module} (rank {LAYERS[part(module)]}) imports {upward}"


def test_no_import_circles() -> None:
    """Depth-first search for a back edge between modules."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                circle = [*path[path.index(target) :], target]
                raise AssertionError(f"import circle: {' -> '.join(circle)}")
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [module])
