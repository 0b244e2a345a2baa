"""The corpus of real programs (tests/real_programs) run bare, under PyTorch's CUDA sanitizer and
under `gpurace watch`: what tests/test_real_programs_gpu.py, tests/test_capture_recorded_real.py
and tests/real_programs/bench.py share. Nothing here imports PyTorch; the programs do.

    from tests.real_runs import load_corpus, run_bare, run_watched, problems

A corpus entry (tests/real_programs/corpus.py's ``Entry``: name, script, args, needs, library)
runs as ``python tests/real_programs/SCRIPT ARGS [--iters N]`` from the checkout's root. It exits
0 (its answer is right), 1 (it printed ``WRONG: ...``) or 77 (this variant cannot run here), and
its last stdout lines are ``answer=...``, ``step_max_s=...`` and ``work_s=...``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.capture.bench import CSAN, run_command, watch_argv, watch_env

ROOT = Path(__file__).resolve().parent.parent
CORPUS_FILE = ROOT / "tests" / "real_programs" / "corpus.py"
CANNOT_RUN = 77  # a program's own "this variant cannot run here"
CANNOT_RUN_SUFFIX = ".exit77.txt"  # a recording folder's word that an entry exits 77 there
PENDING_SUFFIX = ".pending.txt"  # its word that an entry's recording waits for a GPU run
SANITIZER_ENV = {"TORCH_CUDA_SANITIZER": "1"}
_SAID = re.compile(r"^(answer|step_max_s|work_s)=(.*?)[ \t\r]*$", re.M)
_FRAME = re.compile(r'File "([^"]+)", line \d+, in ')
_TRACEBACK = "Traceback (most recent call last):"
# Frames that start the program (the capture's boot, the fork server, runpy): gpurace's files,
# but on every traceback of the program's own, so they say nothing about gpurace failing.
_LAUNCH = ("harness/capture/boot.py", "harness/capture/forkserver.py", "runpy.py",
           "<frozen runpy>")


def load_corpus(path: Path = CORPUS_FILE) -> tuple[Any, ...]:
    """The entries of a corpus file, imported by its path (tests/ is not a package, and
    corpus.py is plain Python); () where there is no corpus yet."""
    if not path.is_file():
        return ()
    name = f"gpurace_real_corpus_{path.parent.name}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a NamedTuple or dataclass may look its module up
    spec.loader.exec_module(module)
    return tuple(module.CORPUS)


@dataclass(frozen=True)
class Said:
    """A program's last words: its answer and timings (None where it did not say them)."""

    answer: str | None = None
    step_max_s: float | None = None
    work_s: float | None = None


def said(text: str) -> Said:
    """The last ``answer=``, ``step_max_s=`` and ``work_s=`` lines of ``text``."""
    last = {key: value for key, value in _SAID.findall(text)}
    return Said(last.get("answer"), _number(last.get("step_max_s")), _number(last.get("work_s")))


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _tail(text: str, lines: int = 1) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


@dataclass
class ProgramRun:
    """One run of a program as it runs alone (bare, or under the sanitizer)."""

    code: int | None  # None: killed at the timeout
    out: str
    err: str
    said: Said

    def why(self) -> str:
        """Its last line of output: why it exited 77, or its ``WRONG: ...``."""
        return _tail(self.err) or _tail(self.out) or "no output"

    @property
    def csan(self) -> bool:
        return CSAN in self.err


@dataclass
class WatchedRun:
    """One run of a program under ``gpurace watch --runs 1``."""

    code: int | None  # the watch's own exit status; None: killed at the timeout
    doc: dict[str, Any]  # the run document; {} where the watch wrote none
    err: str  # the program's stdout and stderr, and the watch's own
    said: Said
    status: int | None = None  # the program's exit status, as the run document says it
    timed_out: bool = False  # the watch killed the program at --timeout
    detected: int = 0
    findings: list[str] = field(default_factory=list)  # each finding's ``missing`` line
    events: Path | None = None
    stats: dict[str, Any] | None = None  # the capture's "stats" event, None where none came


def _timed(argv: list[str], env: dict[str, str] | None, timeout: float
           ) -> tuple[int | None, str, str]:
    """``run_command`` from the checkout's root, a run past ``timeout`` killed and said."""
    try:
        return run_command(argv, env, timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x or ""
                    for x in (exc.stdout, exc.stderr))
        return None, out, f"{err}\nkilled after {timeout:g} s"


def command(entry: Any, python: str, corpus: Path = CORPUS_FILE,
            iters: int | None = None) -> list[str]:
    """How an entry runs: its script by its path from the checkout's root where it is inside
    it (the findings then name the program's lines as the corpus does)."""
    script = (corpus.parent / entry.script).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return [python, str(shown), *entry.args, *(["--iters", str(iters)] if iters else [])]


def run_bare(entry: Any, python: str, corpus: Path = CORPUS_FILE, iters: int | None = None,
             timeout: float = 900.0, env: dict[str, str] | None = None) -> ProgramRun:
    code, out, err = _timed(command(entry, python, corpus, iters), env, timeout)
    return ProgramRun(code, out, err, said(out))


def run_sanitized(entry: Any, python: str, corpus: Path = CORPUS_FILE,
                  iters: int | None = None, timeout: float = 900.0) -> ProgramRun:
    """A run under PyTorch's CUDA sanitizer (it stops the program at its first report)."""
    return run_bare(entry, python, corpus, iters, timeout, SANITIZER_ENV)


def run_watched(entry: Any, python: str, out_dir: Path, corpus: Path = CORPUS_FILE,
                iters: int | None = None, timeout: float = 900.0) -> WatchedRun:
    """One watched run; the watch kills the program at ``timeout``, and is itself given two
    minutes more to write what it found."""
    argv = watch_argv(python, out_dir, command(entry, python, corpus, iters),
                      "--runs", "1", "--timeout", f"{timeout:g}")
    code, out, err = _timed(argv, watch_env(), timeout + 120)
    try:
        doc = json.loads(out)
        result, run = doc["results"][0], doc["watch"]["runs"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return WatchedRun(code, {}, f"{err}\n{out}" if out else err, said(err))
    events = Path(run["events"]) if run.get("events") else None
    return WatchedRun(code, doc, err, said(err), status=run.get("status"),
                      timed_out=bool(run.get("timed_out")), detected=int(result["detected"]),
                      findings=[f["missing"] for f in result["findings"]], events=events,
                      stats=capture_stats(events) if events and events.is_file() else None)


def capture_stats(events: Path, source: str = "torch") -> dict[str, Any] | None:
    """The last ``["stats", {...}]`` event ``source`` wrote into a run's events file. Only
    those lines are parsed: a real program's events file can be large."""
    found = None
    with open(events, "rb") as f:
        for line in f:
            if not line.startswith(b'["stats"'):
                continue
            try:
                event = json.loads(line)
            except ValueError:  # a torn last line
                continue
            if len(event) > 1 and isinstance(event[1], dict) and \
                    event[1].get("source") == source:
                found = event[1]
    return found


def _ours(path: str) -> bool:
    """Whether a traceback frame's file is gpurace's own (this checkout's harness/, or an
    installed gpurace's)."""
    where = Path(path) if Path(path).is_absolute() else ROOT / path
    return where.is_relative_to(ROOT / "harness") or "/site-packages/harness/" in path


def _blocks(text: str) -> list[str]:
    """Each traceback in ``text``: from its header to its first unindented line (the
    exception), both kept."""
    blocks, current = [], None
    for line in text.splitlines():
        if _TRACEBACK in line:
            if current:
                blocks.append("\n".join(current))
            current = [line]
        elif current is not None:
            current.append(line)
            if line and not line[0].isspace():
                blocks.append("\n".join(current))
                current = None
    if current:
        blocks.append("\n".join(current))
    return blocks


def gpurace_tracebacks(text: str, bare: str = "") -> list[str]:
    """The tracebacks in ``text`` that are gpurace's: through its own code past the frames
    that start the program (or all its own: the watch failing), and either raised in it or
    ending in an exception ``bare`` (the program's output alone) does not have. A program's
    exception that its own op raised while the capture was on the stack, as it raises bare,
    is the program's."""
    found = []
    for block in _blocks(text):
        frames = _FRAME.findall(block)
        start = 0
        while start < len(frames) and frames[start].replace("\\", "/").endswith(_LAUNCH):
            start += 1
        rest = frames[start:] or frames
        if not any(_ours(frame) for frame in rest):
            continue
        exception = block.splitlines()[-1].strip()
        if _ours(rest[-1]) or not exception or exception not in bare:
            found.append(block)
    return found


def probe(python: str, modules: list[str]) -> tuple[dict[str, str], str]:
    """One interpreter's word on which of ``modules`` do not import (each with why) and on its
    machine (the GPU's name, the PyTorch and CUDA versions), in one process: each program's
    imports cost seconds."""
    code = (
        "import importlib, json, platform, sys\n"
        "missing = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except BaseException as exc:\n"
        "        missing[name] = f'{type(exc).__name__}: {exc}'[:300]\n"
        "try:\n"
        "    import torch\n"
        "    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA GPU'\n"
        "    machine = f'{gpu}, torch {torch.__version__} (CUDA {torch.version.cuda})'\n"
        "except Exception as exc:\n"
        "    machine = f'no torch ({type(exc).__name__})'\n"
        "machine += f', Python {platform.python_version()}'\n"
        "print(json.dumps({'missing': missing, 'machine': machine}))\n")
    status, out, err = _timed([python, "-c", code, *sorted(set(modules))], None, 600)
    try:
        said_ = json.loads(_tail(out))
        return dict(said_["missing"]), str(said_["machine"])
    except (ValueError, KeyError, TypeError):
        why = f"the probe failed (exit {status}): {_tail(err) or _tail(out)}"
        return {name: why for name in modules}, why


def missing_need(entry: Any, missing: dict[str, str]) -> str | None:
    """Why an entry cannot run in this interpreter (the first module it needs that does not
    import), or None."""
    for name in entry.needs:
        if name in missing:
            return f"needs {name}, which does not import: {missing[name]}"
    return None


RACE = "race"
"""An entry's ``expect`` for a program over a library with a real race (shown by hand-placed
delays, tests/real_programs/README.md): the watch must report it, and the race may show in
either run's answer."""


def problems(bare: ProgramRun, watched: WatchedRun, expect: str = "clean") -> list[str]:
    """What differs between a program's bare run and its watched run, or what the watch
    reported: [] when the watch left the program as it was and found nothing. For a program
    that is expected to race (``expect`` :data:`RACE`), [] when the watch found a race and
    broke nothing."""
    found = []
    if not watched.doc:
        return [f"the watch wrote no run document (exit {watched.code}):\n"
                f"{_tail(watched.err, 30)}"]
    if expect == RACE:
        if not watched.findings:
            found.append("no finding: this library's race (shown by hand-placed delays) was "
                         "not seen")
        found.extend(f"a traceback through gpurace's own code on the watched run's stderr:\n"
                     f"{block}" for block in gpurace_tracebacks(
                         watched.err, f"{bare.out}\n{bare.err}"))
        return found
    if watched.status != bare.code or watched.timed_out:
        found.append(f"exit status: bare {bare.code}, watched {watched.status}"
                     f"{' (killed at --timeout)' if watched.timed_out else ''}; watched "
                     f"output:\n{_tail(watched.err, 30)}")
    if bare.code != 0:
        found.append(f"the program fails bare (exit {bare.code}; a corpus program must exit "
                     f"0 here): {bare.why()}")
    if bare.said.answer is None:
        found.append("no answer= line in the bare run's output")
    elif watched.said.answer != bare.said.answer:
        found.append(f"answer: bare {bare.said.answer!r}, watched {watched.said.answer!r}")
    if watched.detected or watched.findings:
        found.append(f"{watched.detected} run(s) with findings, {len(watched.findings)} "
                     "finding(s):\n" + "\n".join(f"  {m}" for m in watched.findings))
    for block in gpurace_tracebacks(watched.err, f"{bare.out}\n{bare.err}"):
        found.append(f"a traceback through gpurace's own code on the watched run's stderr:\n"
                     f"{block}")
    return found


def stats_line(stats: dict[str, Any] | None) -> str:
    """The capture's own account of a run, in one line."""
    if stats is None:
        return "capture: no stats event"
    top = f"{stats.get('max_own_ns', 0) / 1e6:.2f} ms"
    if stats.get("max_site"):
        top += f" at {stats['max_site']}"
    failures = stats.get("failures") or {}
    slow = stats.get("slow") or []
    if slow:
        top += f", {len(slow)} op(s) over 10 ms"
    return (f"capture: {stats.get('ops', 0)} ops, max own {top}"
            + (f", failures {failures}" if failures else ""))
