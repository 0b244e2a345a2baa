"""The wheel, installed into a fresh virtual environment, runs from an empty folder: the built-in
scenarios travel inside it, and the pytest plugin comes with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from this checkout, and nothing of the checkout. Its
    third-party dependencies come from this environment's site-packages through a .pth line,
    so the test needs no network; gpurace itself comes only from the wheel."""
    root = tmp_path_factory.mktemp("wheel")
    # Without the checkout on the path: pip would take its gpurace.egg-info for gpurace
    # installed in the venv, and install nothing.
    env = _without_checkout()
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-v", "-w", str(root / "dist"), str(REPO)],
                           check=True, cwd=root, capture_output=True, text=True, env=env)
    (root / "build.log").write_text(built.stdout + built.stderr)
    [wheel] = (root / "dist").glob("gpurace-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   capture_output=True, env=env)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True,
                          text=True).stdout.strip()
    (Path(site) / "deps-from-test.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _without_checkout() -> dict[str, str]:
    """This environment, but for what would put the checkout on a Python's path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPURACE_PATH")}


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=cwd,
                          env=_without_checkout(),
                          capture_output=True, text=True, timeout=300)


def test_the_installed_wheel_runs_the_smoke_suite_from_an_empty_folder(
        installed: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    where = _run(installed, empty, "python", "-c", "import harness, gpurace_scenarios; "
                 "print(harness.__file__); print(gpurace_scenarios.__path__[0])")
    assert all(str(installed) in line for line in where.stdout.splitlines()), where.stdout
    listed = _run(installed, empty, "gpurace", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    names = {d["name"] for d in json.loads(listed.stdout)["documents"]}
    assert {"smoke", "zoo", "release-fence", "mini-sglang-103"} <= names
    ran = _run(installed, empty, "gpurace", "run", "smoke", "--backend", "sim", "--trials",
               "3")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    print(f"\n$ gpurace run smoke --backend sim --trials 3   (in {empty})\n{ran.stderr}"
          f"{ran.stdout}")
    assert "release-fence (buggy): pass" in ran.stderr and "exit 0 (ok)" in ran.stdout
    assert list(empty.glob("gpurace-reports/run-*/run.json"))
    version = _run(installed, empty, "gpurace", "--version")
    assert version.returncode == 0 and "version" in version.stdout
    schema = _run(installed, empty, "gpurace", "schema", "run")
    assert schema.returncode == 0 and json.loads(schema.stdout)["title"] == "gpurace run"


def test_the_wheel_builds_without_warnings_and_holds_the_childrens_sitecustomize(
        installed: Path) -> None:
    # A watched program's Python children start with the sitecustomize of this folder; setuptools
    # warned that it would stop installing it while the folder was package data, not a package.
    log = (installed.parent / "build.log").read_text()
    assert "BuildBackendWarning" not in log and "would be ignored" not in log, log[-3000:]
    found = list(installed.glob("lib/python*/site-packages/harness/capture/child_site/"
                                "sitecustomize.py"))
    assert len(found) == 1


def test_the_installed_pytest_plugin_runs_a_scenario_as_a_test(installed: Path,
                                                               tmp_path: Path) -> None:
    folder = tmp_path / "checks"
    folder.mkdir()
    scenario = (REPO / "scenarios" / "release_fence.yaml").read_text()
    (folder / "release.gpurace.yaml").write_text(scenario.replace("trials: 100", "trials: 3"))
    result = _run(installed, folder, "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                  "--gpurace-backend", "sim")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_the_wheel_holds_every_module_of_the_source(installed: Path) -> None:
    """The wheel's packages are listed by name in pyproject.toml: a new folder of modules left
    off that list would be missing from every install (and its commands fail there only)."""
    site = Path(_run(installed, installed, "python", "-c", "import harness, os; "
                     "print(os.path.dirname(os.path.dirname(harness.__file__)))").stdout.strip())
    wanted = {str(p.relative_to(REPO)) for package in ("harness", "kvcore", "reports")
              for p in (REPO / package).rglob("*.py")}
    shipped = {str(p.relative_to(site)) for package in ("harness", "kvcore", "reports")
               for p in (site / package).rglob("*.py")}
    assert sorted(wanted - shipped) == []
