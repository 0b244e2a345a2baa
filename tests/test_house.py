"""The shape of the code: which module imports which, read from the source (every import
statement, those inside functions and under TYPE_CHECKING included, since each is a dependency
a reader has to follow). No two modules reach each other, however far round; kvcore and reports
import nothing above them; every room has a floor and imports only from its own or below."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "kvcore", "reports")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of the project's own modules (a name imported from a package is
    the submodule when there is one of that name, else the package)."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(filter(None, (known(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    whole = f"{base}.{alias.name}"
                    found.add(known(whole) if whole in modules else known(base))  # type: ignore
        graph[name] = found - {name, None}  # type: ignore[operator]
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

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
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_module_reaches_back_to_itself_through_its_imports() -> None:
    assert _circles(_imports(_modules())) == []


def test_the_circle_finder_sees_a_circle_however_far_round() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert _circles(graph) == [["a", "b", "c"], ["e", "e2"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_kvcore_and_reports_import_nothing_above_them() -> None:
    graph = _imports(_modules())
    above = {"kvcore": ("harness", "reports"), "reports": ("harness", "kvcore")}
    reaching_up = sorted((name, target) for name, targets in graph.items()
                         for target in targets
                         if target.split(".")[0] in above.get(name.split(".")[0], ()))
    assert reaching_up == []


def test_the_reader_follows_imports_inside_functions_and_names_of_submodules() -> None:
    """What the tests above rely on: a deferred import and a package's name for a submodule
    each count."""
    graph = _imports(_modules())
    # kvcore.device opens the cuda backend inside a function only.
    assert "kvcore.device.cuda" in graph["kvcore.device"]
    # `from harness.traces.ticket import Ticket`: the module, not the package.
    assert "harness.traces.ticket" in graph["harness.run.executor"]


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
    # 6: the command line, and the schemas' builder, which reads every layer.
    "harness.cli": 6, "harness.tools": 6,
}
"""Each room's floor: a module imports only from its own floor or below."""


def _floor(module: str) -> int | None:
    while module and module not in FLOORS:
        module = module.rpartition(".")[0]
    return FLOORS.get(module)


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if _floor(b) > _floor(a))  # type: ignore[operator]


def test_every_module_lives_on_a_floor_and_imports_only_downward() -> None:
    graph = _imports(_modules())
    assert sorted(m for m in graph if _floor(m) is None) == []  # a new room needs a floor
    assert _upward(graph) == []


def test_the_floor_check_sees_an_upward_import() -> None:
    graph = {"harness.races.detector": {"harness.run.runner"},
             "harness.run.runner": {"harness.races.detector"}}
    assert _upward(graph) == [("harness.races.detector", "harness.run.runner")]
