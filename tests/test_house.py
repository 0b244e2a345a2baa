"""The shape of the code (``python -m harness.tools.house`` prints it): no two modules reach
each other, however far round; kvcore and reports import nothing above them; every room has a
floor and imports only from its own or below; no module over 800 lines, no class over 600."""

from __future__ import annotations

from harness.tools.house import (CLASS_MAX, MODULE_MAX, circles, floor, imports, main, modules,
                                 sizes, upward)

def test_no_module_reaches_back_to_itself_through_its_imports() -> None:
    assert circles(imports(modules())) == []


def test_the_circle_finder_sees_a_circle_however_far_round() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert circles(graph) == [["a", "b", "c"], ["e", "e2"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_kvcore_and_reports_import_nothing_above_them() -> None:
    graph = imports(modules())
    above = {"kvcore": ("harness", "reports"), "reports": ("harness", "kvcore")}
    reaching_up = sorted((name, target) for name, targets in graph.items()
                         for target in targets
                         if target.split(".")[0] in above.get(name.split(".")[0], ()))
    assert reaching_up == []


def test_the_reader_follows_imports_inside_functions_and_names_of_submodules() -> None:
    """What the tests above rely on: a deferred import and a package's name for a submodule
    each count."""
    graph = imports(modules())
    # kvcore.device opens the cuda backend inside a function only.
    assert "kvcore.device.cuda" in graph["kvcore.device"]
    # `from harness.traces.ticket import Ticket`: the module, not the package.
    assert "harness.traces.ticket" in graph["harness.run.executor"]


def test_every_module_lives_on_a_floor_and_imports_only_downward() -> None:
    graph = imports(modules())
    assert sorted(m for m in graph if floor(m) is None) == []  # a new room needs a floor
    assert upward(graph) == []


def test_the_floor_check_sees_an_upward_import() -> None:
    graph = {"harness.races.detector": {"harness.run.runner"},
             "harness.run.runner": {"harness.races.detector"}}
    assert upward(graph) == [("harness.races.detector", "harness.run.runner")]


def test_no_module_over_800_lines_and_no_class_over_600() -> None:
    mods, classes = sizes(modules())
    over = sorted(f"{s.name}: {s.lines} lines" for s in mods if s.lines > MODULE_MAX)
    over += sorted(f"{s.name}: {s.lines} lines" for s in classes if s.lines > CLASS_MAX)
    assert over == [], "cut these in parts along their ideas"


def test_the_house_tool_prints_the_largest_module_and_class(capsys) -> None:
    assert main(["--top", "1"]) == 0
    out = capsys.readouterr().out
    mods, classes = sizes(modules())
    assert f"{mods[0].lines:5d}  {mods[0].name}" in out
    assert f"{classes[0].lines:5d}  {classes[0].name}" in out
    assert "circles: 0; upward imports: 0; modules without a floor: 0" in out
