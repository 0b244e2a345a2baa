"""gpurace as a pytest plugin: each scenario variant becomes a test item.

    pytest --gpurace scenarios/                    every scenario file under scenarios/
    pytest --gpurace scenarios/zoo --gpurace-dangerous --gpurace-trials 20
    pytest                                        files named *.gpurace.yaml, always
    pytest --gpurace-watch tests/                  every test under capture (PyTorch, CuPy)

A variant's expectation is the test: it passes when the variant did what it expects (stay
clean, reproduce, hang), fails with the run's summary, the first finding and the incident
folders when it did not, and is skipped, with the reason, when it could not run here (a
dangerous variant on a GPU without ``--gpurace-dangerous``, no GPU for ``--gpurace-backend
cuda``): what `gpurace run` says with exit 77. ``-k``, ``-x``, ``--junitxml`` work as for any
test; ``-p no:gpurace`` turns the plugin off. Installed with gpurace (entry point ``pytest11``).

``--gpurace-watch`` runs every test with `gpurace watch`'s capture on, in pytest's own process
(a test marked ``@pytest.mark.gpurace_watch`` is watched without the option): a test whose
PyTorch or CuPy work races fails, the finding as its failure text; what the capture could not
see is said once, in a ``gpurace watch`` section of the summary. Where neither PyTorch nor CuPy
imports, the option says so once and the tests run unwatched.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.errors import BackendUnavailable, ScenarioError
from harness.lang.model import Scenario, Suite
from harness.results.outcome import Status, VariantResult
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.scenario import load_document
from harness.words import counted

SUFFIX = ".gpurace.yaml"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpurace", "gpurace scenarios as tests")
    group.addoption("--gpurace", action="store_true",
                    help="Collect every scenario YAML file under the given paths (files named "
                         "*.gpurace.yaml are collected anyway).")
    group.addoption("--gpurace-backend", default="auto", choices=["auto", "cuda", "sim"],
                    help="cuda, sim, or auto (the GPU when one is usable). Default: auto.")
    group.addoption("--gpurace-trials", type=int, default=None,
                    help="Trials per variant (default: each scenario's own).")
    group.addoption("--gpurace-seed", type=int, default=0, help="The run's seed (default 0).")
    group.addoption("--gpurace-dangerous", action="store_true",
                    help="Run dangerous variants too (they may crash a worker's CUDA context).")
    group.addoption("--gpurace-poison", action="store_true",
                    help="Poison released pages (as `gpurace run --poison`): a stale reader "
                         "sees poison; a correct pool never shows it.")
    group.addoption("--gpurace-out", default="gpurace-reports",
                    help="Folder for the runs' reports (default: gpurace-reports).")
    group.addoption("--gpurace-watch", action="store_true",
                    help="Watch every test's PyTorch and CuPy stream work (as `gpurace "
                         "watch`): a test whose work races fails with the finding.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpurace_watch: watch this test's PyTorch and CuPy "
                                       "stream work; a race fails it (as --gpurace-watch)")


_WATCH: list[Any] = []  # the process's one InProcessWatch, made at the first watched test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    wanted = item.config.getoption("gpurace_watch", False) or \
        item.get_closest_marker("gpurace_watch") is not None
    if not wanted:
        yield
        return
    if not _WATCH:
        from harness.capture.in_process import InProcessWatch
        _WATCH.append(InProcessWatch())
        if not _WATCH[0].active:
            item.config.issue_config_time_warning(pytest.PytestWarning(
                "--gpurace-watch: neither PyTorch nor CuPy imports here; tests run "
                "unwatched"), stacklevel=2)
    watch = _WATCH[0]
    if not watch.active:
        yield
        return
    watch.start()
    outcome = yield
    watched = watch.finish()
    if watched.failed:
        item.warn(pytest.PytestWarning(
            f"gpurace watch: the analysis of this test's stream work failed ({watched.failed}):"
            " a fault of gpurace's, not the test's; its work was not checked. Please report "
            "it"))
    if watched.findings and outcome.excinfo is None:
        outcome.force_exception(RaceFound(_races(watched.findings)))


class RaceFound(AssertionError):
    """A watched test's stream work raced; the message is each finding."""


def _races(findings: list[dict[str, Any]]) -> str:
    lines = [f"gpurace watch: {len(findings)} race(s) in this test's stream work"]
    for f in findings:
        lines.append(f"race: {f['missing']}")
        for side in ("first", "second"):
            op = f[side]
            lines.append(f"  {side}: {op['stream']} {op['kind']} {op['access']} at "
                         f"{op.get('step') or op.get('site') or 'op ' + str(op['seq'])}")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The watch's sources stop here, and what they say of the whole session (ops they could
    not read, work run unseen, counted) is its own section of the summary, never silent."""
    if not _WATCH:
        return
    notes = _WATCH.pop().close()
    if notes:
        terminalreporter.write_sep("=", "gpurace watch")
        for note in notes:
            terminalreporter.write_line(f"note: {note}")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _WATCH:  # no summary (an interrupted session): switch the sources off all the same
        _WATCH.pop().close()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    name = file_path.name
    wanted = name.endswith(SUFFIX) or (
        parent.config.getoption("gpurace") and file_path.suffix in (".yaml", ".yml"))
    if wanted:
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    """One scenario file: an item per variant. A suite file adds nothing (its scenarios are
    files of their own); a file that does not load is a collection error at its line."""

    def collect(self) -> Iterator[VariantItem]:
        try:
            document = load_document(self.path)
        except ScenarioError as exc:
            raise self.CollectError(str(exc)) from None
        if isinstance(document, Suite):
            return
        for variant in document.variants:
            yield VariantItem.from_parent(self, name=variant.name, scenario=document,
                                          variant=variant.name)


class VariantFailed(Exception):
    """A variant did not do what it expects; the message is its summary."""


class VariantItem(pytest.Item):
    """One scenario variant, run by gpurace's runner as `gpurace run FILE --variant NAME`."""

    def __init__(self, *, scenario: Scenario, variant: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.variant = variant

    def runtest(self) -> None:
        config = self.config
        options = RunOptions(backend=config.getoption("gpurace_backend"),
                             dangerous=config.getoption("gpurace_dangerous"),
                             trials=config.getoption("gpurace_trials"),
                             seed=config.getoption("gpurace_seed"), variants=(self.variant,),
                             out_dir=Path(config.getoption("gpurace_out")),
                             poison=config.getoption("gpurace_poison"))
        try:
            runner = Runner(options)
        except BackendUnavailable as exc:
            _skip_here(str(exc))
        # No user_properties: pytest's xunit2 JUnit has no place for them in a testcase; the
        # failure text names the incident folders.
        [result] = runner.run([self.scenario]).results
        if result.status is Status.SKIP:
            _skip_here(result.reason.replace("--dangerous", "--gpurace-dangerous"))
        if result.status is Status.FAIL:
            raise VariantFailed(_explain(result))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: str | None = None) -> str:
        if isinstance(excinfo.value, VariantFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style))  # type: ignore[arg-type]

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, f"{self.scenario.name} [{self.variant}]"  # 0: its first line


def _skip_here(reason: str) -> None:
    """Skip the item, reported at the scenario file (``-rs``), not at this plugin's line: the
    skip pytest.mark.skip makes says where the test is the same way."""
    raise pytest.skip.Exception(reason, _use_item_location=True)


def _explain(result: VariantResult) -> str:
    """What a failed variant's test says: the verdict, the counts, the first finding and the
    first bad trial, and where the incident folders are."""
    counts = ", ".join(f"{k} {v}" for k, v in result.outcomes().items() if v)
    lines = [f"{result.scenario} ({result.variant}) expected {result.expect}: {result.reason}",
             f"{counted(result.trials, 'trial')}: {counts}; detected {result.detected}"]
    findings = result.finding_summary(1)
    if findings:
        lines.append(f"race: {findings[0]['missing']}")
    first = result.first_manifested
    if first is not None:
        lines.append(f"first: trial {first.index} (seed {first.seed}) {first.outcome.value}: "
                     f"{first.detail}")
    lines += [f"incident: {path}" for path in result.reports]
    return "\n".join(lines)
