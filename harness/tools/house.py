"""The shape of the code, read from its source: which module imports which, each room's floor,
and how long its modules and classes are.

    python -m harness.tools.house          the largest modules and classes, circles, upward imports

Every import statement counts, those inside functions and under TYPE_CHECKING too, since each is
a dependency a reader has to follow. ``tests/test_house.py`` holds the rules: no circles, kvcore
and reports import nothing above them, every module imports only from its own floor or below,
no module over :data:`MODULE_MAX` lines and no class over :data:`CLASS_MAX`.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "kvcore", "reports")
MODULE_MAX = 800
"""Lines a module may have: more is two ideas in one file, or one idea not yet cut in parts."""
CLASS_MAX = 600
"""Lines a class may have."""

FLOORS = {
    # 0: the system under test and the report renderers, which know nothing of the engine.
    "kvcore": 0, "reports": 0,
    # 1: what every room stands on: errors, bounds, input reading, write faults, process
    # lifetime, the schemas' files, the GPU's health.
    "harness": 1, "harness.errors": 1, "harness.limits": 1, "harness.inputs": 1,
    "harness.faults": 1, "harness.processes": 1, "harness.schemas": 1, "harness.gpu": 1,
    # 2: the scenario language, op traces and tickets, what trials come to.
    "harness.lang": 2, "harness.traces": 2, "harness.results": 2,
    # 3: the race detector, below both of its sources.
    "harness.races": 3,
    # 4: running trials.
    "harness.run": 4,
    # 5: what runs trials or watches programs: searches, the capture, the benchmarks, the plugin.
    "harness.analyses": 5, "harness.capture": 5, "harness.speed": 5, "harness.bench": 5,
    "harness.pytest_plugin": 5,
    # 6: the command line, and the project's own tools, which read every layer.
    "harness.cli": 6, "harness.tools": 6,
}
"""Each room's floor: a module imports only from its own floor or below."""


class Size(NamedTuple):
    """A module's or a class's length in lines, and where it is."""

    lines: int
    name: str  # a module's path from the repository's root, or path:Class
    path: str


def modules(root: Path = REPO) -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(found: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of the project's own modules (a name imported from a package is
    the submodule when there is one of that name, else the package)."""

    def known(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    whole = f"{base}.{alias.name}"
                    targets.add(known(whole) if whole in found else known(base))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def floor(module: str) -> int | None:
    """The floor of a module's room, or None for a room that has none yet."""
    while module and module not in FLOORS:
        module = module.rpartition(".")[0]
    return FLOORS.get(module)


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that reach a higher floor than their module's."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if (floor(b) or 0) > (floor(a) or 0))


def sizes(found: dict[str, Path], root: Path = REPO) -> tuple[list[Size], list[Size]]:
    """Every module's and every class's length, the longest first."""
    mods, classes = [], []
    for path in found.values():
        text = path.read_text()
        where = str(path.relative_to(root))
        mods.append(Size(text.count("\n"), where, where))
        for node in ast.walk(ast.parse(text, where)):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                classes.append(Size(lines, f"{where}:{node.name}", where))
    return sorted(mods, reverse=True), sorted(classes, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.tools.house",
        description="The largest modules and classes, and the import rules' breaches.")
    parser.add_argument("--top", type=int, default=5, help="how many of each to list (5)")
    args = parser.parse_args(argv)
    found = modules()
    graph = imports(found)
    mods, classes = sizes(found)
    for title, rows, limit in (("modules", mods, MODULE_MAX), ("classes", classes, CLASS_MAX)):
        over = sum(1 for s in rows if s.lines > limit)
        print(f"largest {title} (limit {limit} lines; {over} over):")
        for s in rows[:args.top]:
            print(f"  {s.lines:5d}  {s.name}{'  OVER' if s.lines > limit else ''}")
    found_circles = circles(graph)
    homeless = sorted(m for m in graph if floor(m) is None)
    up = upward(graph)
    print(f"circles: {len(found_circles)}; upward imports: {len(up)}; "
          f"modules without a floor: {len(homeless)}")
    for group in found_circles:
        print("  circle: " + " -> ".join(group))
    for a, b in up:
        print(f"  upward: {a} imports {b}")
    for m in homeless:
        print(f"  no floor: {m} (give its room one in FLOORS)")
    return 1 if found_circles or up or homeless else 0


if __name__ == "__main__":
    raise SystemExit(main())
