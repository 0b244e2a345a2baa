"""Where scenarios come from: what a run's targets name, and what `gpurace list` shows.

A target is a scenario or suite file, a folder of scenario files, or a name. A name is looked up
in the search folders, in order: the working tree (``./`` and ``./scenarios/``), the folders of
``--path`` and of ``GPURACE_PATH`` (separated by ``:``), then the scenarios built into gpurace
(shipped in the wheel as the package ``gpurace_scenarios``). In each folder a name matches a
suite (``suites/NAME.yaml``), then a scenario file named after it (``-`` or ``_``), at any depth.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ScenarioError, TargetError
from harness.lang.model import Scenario, Suite
from harness.lang.scenario import load_document

PATH_VARIABLE = "GPURACE_PATH"


def builtin_root() -> Path:
    """The built-in scenarios, suites and tickets: the ``scenarios/`` beside this code when it
    runs from a checkout (code and data from one place), else the installed package's data."""
    checkout = Path(__file__).resolve().parents[2] / "scenarios"
    if (checkout / "suites").is_dir():
        return checkout
    spec = importlib.util.find_spec("gpurace_scenarios")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return checkout


SCENARIO_ROOT = builtin_root()
"""Where the built-in scenarios are."""


def shown_target(path: str | Path, name: str) -> str:
    """How a command names a scenario so that it runs that file again: its path, relative to
    here when it is under here; a built-in scenario of an installed gpurace by its name (its
    path would be inside site-packages)."""
    path = Path(path)
    try:
        shown = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        shown = str(path)
    if not shown.startswith(".."):
        return shown
    builtin = SCENARIO_ROOT.resolve()
    if builtin.name != "scenarios" and path.resolve().is_relative_to(builtin):
        return name  # the wheel's gpurace_scenarios: found by name from any folder
    return str(path)


def search_folders(extra: Sequence[Path] = ()) -> list[Path]:
    """The folders a name is looked up in, first match wins (see the module docstring)."""
    cwd = Path.cwd()
    env = [Path(p) for p in os.environ.get(PATH_VARIABLE, "").split(os.pathsep) if p]
    seen: list[Path] = []
    for folder in (cwd, cwd / "scenarios", *extra, *env, SCENARIO_ROOT):
        resolved = folder.resolve()
        if resolved not in seen and resolved.is_dir():
            seen.append(resolved)
    return seen


def resolve_targets(targets: Sequence[str], extra: Sequence[Path] = ()) -> list[Scenario]:
    """Scenario files, folders of them, suite files, or suite/scenario names, in order, each
    scenario once."""
    found: list[Scenario] = []
    seen: set[Path] = set()

    def add(path: Path) -> None:
        doc = load_document(path)
        if isinstance(doc, Suite):
            if doc.path.resolve() in seen:
                return  # a suite named twice (the loader refuses suites inside suites)
            seen.add(doc.path.resolve())
            for member in doc.scenarios:
                add(member)
        elif doc.path.resolve() not in seen:
            seen.add(doc.path.resolve())
            found.append(doc)

    for target in targets:
        path = Path(target)
        if path.is_dir():
            files = _yaml_files(path)
            if not files:
                raise TargetError(f"{target}: no scenario files (*.yaml) in this folder")
            for file in files:
                add(file)
        elif path.exists():
            add(path)
        else:
            add(named(target, extra))
    return found


def named(name: str, extra: Sequence[Path] = ()) -> Path:
    """The file a bare name stands for, in the first search folder that has one. The working
    tree's own folder is searched only at its top: it may hold anything below."""
    folders = search_folders(extra)
    cwd = Path.cwd().resolve()
    stems = sorted({name, name.replace("-", "_")})
    for folder in folders:
        suite = folder / "suites" / f"{name}.yaml"
        if suite.is_file():
            return suite
        for stem in stems:
            if (folder / f"{stem}.yaml").is_file():
                return folder / f"{stem}.yaml"
        if folder != cwd:
            deeper = sorted(p for p in folder.glob("**/*.yaml") if p.stem in stems)
            if deeper:
                return deeper[0]
    raise TargetError(f"{name}: no such file, folder, suite or scenario."
                      f"{_did_you_mean(name, folders, cwd)} `gpurace list` shows them all "
                      f"(looked in {', '.join(str(f) for f in folders)})")


def _did_you_mean(name: str, folders: Sequence[Path], cwd: Path) -> str:
    """The closest names to a misspelt one, as " Did you mean a or b?", or "". The names are
    those `gpurace list` shows (``-``, not ``_``): each can be typed as it is shown."""
    known: set[str] = set()
    for folder in folders:
        # The working tree is searched only at its top (see named): so are its names.
        found = [*folder.glob("*.yaml"), *folder.glob("suites/*.yaml")] if folder == cwd \
            else folder.glob("**/*.yaml")
        known.update(p.stem.replace("_", "-") for p in found)
    close = difflib.get_close_matches(name.replace("_", "-"), sorted(known), n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(close)}?" if close else ""


@dataclass(frozen=True)
class Listed:
    """What `gpurace list` found: the documents that load, and the files that do not (with
    their error)."""

    documents: list[Scenario | Suite]
    broken: list[tuple[Path, str]]


def catalog(extra: Sequence[Path] = ()) -> Listed:
    """Every scenario and suite built in and in the ``--path``/``GPURACE_PATH`` folders."""
    env = [Path(p) for p in os.environ.get(PATH_VARIABLE, "").split(os.pathsep) if p]
    documents: list[Scenario | Suite] = []
    broken: list[tuple[Path, str]] = []
    for path in _unique(f for folder in [*extra, *env, SCENARIO_ROOT]
                        for f in _yaml_files(folder, deep=True)):
        try:
            documents.append(load_document(path))
        except ScenarioError as exc:
            broken.append((path, str(exc)))
    return Listed(documents, broken)


def _yaml_files(folder: Path, deep: bool = False) -> list[Path]:
    if not folder.is_dir():
        return []
    pattern = "**/*.y*ml" if deep else "*.y*ml"
    return sorted(p for p in folder.glob(pattern) if p.suffix in (".yaml", ".yml"))


def _unique(paths: Iterable[Path]) -> list[Path]:
    seen: set[Path] = set()
    out = []
    for path in paths:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out
