"""The watched program's Python children: each one that uses the GPU through PyTorch or CuPy is
watched into an events file of its own, and analysed on its own.

The boot (:mod:`harness.capture.boot`) hands its children, through their environment, a folder
for their events (``boot.CHILDREN_ENV``) and a PYTHONPATH whose first entry holds a
``sitecustomize`` (``harness/capture/child_site``). A child interpreter runs it before its first
line: a ``multiprocessing`` worker started by spawn or forkserver (``torch.multiprocessing.spawn``
is spawn), a ``subprocess`` of a Python, the multiprocessing fork server itself. There
:func:`watch_child` waits, as the boot does, for the child's import of a framework (and for
PyTorch, for its first use of CUDA), and only then is the child watched: its file
``child-PID.jsonl`` is written from its first source on, so a child that never touches the GPU
(multiprocessing's resource tracker, a DataLoader worker) pays nothing and leaves no file. A child
forked from the program or from a child is not watched (its parent's capture is off in it, as
the boot says in its notes); a child whose environment the program replaced is not either.

While a run goes on, the watch reads each child's file as it grows and analyses it
(:class:`ChildWatch`), within a disk budget of the child's own; its findings join the run's, each
saying in its words which process it is (its pid and what it is: "a multiprocessing spawn worker");
its notes join the run's too. What crosses processes (CUDA IPC handles, shared pinned memory) is not
followed: each process is analysed alone. A child queues the delays ``--amplify`` asks for as the
program does, so a race found in a child can be made to show there.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from harness.capture import events as E
from harness.capture.backlog import Backlog
from harness.capture.boot import (BACKLOG_ENV, CHILDREN_ENV, DELAYS_ENV, InstallOnImport,
                                  importable, on_cuda, watch_forks)

if TYPE_CHECKING:
    from harness.capture.analysis import Followed

def role_of(argv: list[str]) -> str:
    """What a child is, from its command line (``sys.orig_argv``)."""
    code = argv[argv.index("-c") + 1] if "-c" in argv[:-1] else ""
    if "multiprocessing.spawn" in code:
        return "a multiprocessing spawn worker"
    if "multiprocessing.forkserver" in code:
        return "the multiprocessing fork server"
    if code:
        return "a Python subprocess (python -c)"
    if "-m" in argv[:-1]:
        return f"a Python subprocess (python -m {argv[argv.index('-m') + 1]})"
    script = next((a for a in argv[1:] if not a.startswith("-")), None)
    return f"a Python subprocess ({os.path.basename(script)})" if script else \
        "a Python subprocess"


class _OnFirstWrite:
    """A file opened at the first write: a child that never starts a source leaves none."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None

    def write(self, text: str) -> int:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        return self._file.write(text)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def watch_child() -> None:
    """Watch this child, if its parent was watched: called by the child's sitecustomize."""
    folder = os.environ.get(CHILDREN_ENV)
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if not folder or "harness.capture.boot" in argv:
        return  # not a watched program's child, or a watch of its own (it boots itself)
    from harness.capture.source import REGISTERED, Deferred

    path = Path(folder) / f"child-{os.getpid()}.jsonl"
    said = os.environ.get(BACKLOG_ENV, "")
    limit = int(said) if said.isdigit() else 0  # never the child's failure
    sink = E.Sink(_OnFirstWrite(path),  # type: ignore[arg-type]
                  Backlog(path, limit) if limit else None)
    found = tuple(source for source in map(Deferred, REGISTERED) if importable(source.module))
    sink.emit(["hello", {"schema": E.CAPTURE_SCHEMA, "pid": os.getpid(),
                         "parent": os.getppid(), "role": role_of(argv), "argv": argv,
                         "cwd": os.getcwd(), "python": sys.version.split()[0],
                         "executable": sys.executable,
                         "importable": [source.name for source in found]}])

    class Install(InstallOnImport):
        def install(self, source: Any) -> None:
            if source.name == "torch":
                # A child that imports PyTorch need not touch CUDA (a DataLoader worker
                # must not): its source starts at CUDA's first use, so such a child pays
                # nothing, not even the dispatch mode's imports.
                on_cuda(lambda: self.started(source))
            else:
                self.started(source)

        def started(self, source: Any) -> None:
            super().install(source)
            # Written now: a pool's worker is often ended by SIGTERM (Pool.__exit__), with
            # no exit handler run (and from here on, whenever it goes quiet).
            sink.flush()

    delays = os.environ.get(DELAYS_ENV)
    amplifier = None
    if delays:
        from harness.capture.amplify import Amplifier, decode
        amplifier = Amplifier(decode(delays), sink.emit)
    hook = Install(sink, found, amplifier)
    sys.meta_path.insert(0, hook)
    watch_forks(sink)

    def finish() -> None:
        if not hook.stops:
            sink.closed = True  # it never touched a framework: no file
            return
        hook.stop_all()
        if amplifier is not None:
            amplifier.report()
        sink.emit(["exit", {"status": None, "error": None, "traceback": None}])
        sink.close()

    atexit.register(finish)


class Child(NamedTuple):
    """A watched child, analysed: its pid, what it is, its events file, the ops captured, its
    findings (as run.json has them, each saying which process it is), its notes, the delays it
    queued, its op trace (the first part that held a race, on a long run; None if the disk
    would not take it), and how its analysis failed, if it did (a fault of gpurace's)."""

    pid: int | None
    role: str
    events: str
    ops: int
    findings: list[dict[str, Any]]
    notes: list[str]
    delays: list[dict[str, Any]]
    trace: str | None = None
    analysis_error: str = ""  # the analysis's own failure, in a line ("": none)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "role": self.role, "events": self.events, "ops": self.ops,
                "findings": len(self.findings), "trace": self.trace}


class ChildWatch:
    """The program's watched children, each analysed on its own while it runs: its events file
    (``child-PID.jsonl`` in ``folder``) read as it grows, its op trace written beside it
    (``trace-child-PID.jsonl``, with ``header``). ``disk_mb`` bounds each child's files as
    ``--disk-mb`` bounds the program's (0: no bound): a child that serves for hours (an engine's
    core process) must not fill the disk the program writes to."""

    def __init__(self, folder: Path, header: dict[str, Any] | None = None,
                 disk_mb: int = 0) -> None:
        self.folder = folder
        self.header = dict(header or {"variant": "watched"})
        self.disk_mb = disk_mb
        self._followed: dict[Path, Followed] = {}  # the children that may still write
        self._ended: dict[Path, Child | None] = {}  # None: its sources saw no op

    def poll(self) -> bool:
        """Follow each child that has begun its events file since the last look, and
        analyse what each wrote since; whether one is behind (:meth:`Followed.poll`). A
        child whose process has ended is analysed to its end and let go (its files closed:
        a program may start hundreds over hours)."""
        behind = False
        for followed in self.followed():
            behind |= followed.poll()
            if _ended(followed):
                self._end(followed)
        return behind

    def _follow(self, path: Path) -> Followed:
        # Here, not at the top: a child imports this module at its start, and pays nothing.
        from harness.capture.analysis import Followed, RunAnalysis, Shares

        shares = Shares.of(self.disk_mb)
        scenario = f"{self.header.get('scenario', 'program')}-{path.stem}"
        analysis = RunAnalysis(self.folder / f"trace-{path.name}",
                               {**self.header, "scenario": scenario}, part_bytes=shares.part)
        return Followed(path, analysis, keep=shares.keep, backlog=shares.backlog)

    def followed(self) -> list[Followed]:
        """The children followed now (begun, and not known to have ended), in the order of
        their files' names."""
        if self.folder.is_dir():
            for path in self.folder.glob("child-*.jsonl"):
                if path not in self._followed and path not in self._ended:
                    self._followed[path] = self._follow(path)
        return [self._followed[path] for path in sorted(self._followed)]

    def _end(self, followed: Followed) -> None:
        """Analyse a child that has ended to its file's end, and close its files. A child
        whose sources saw no op (a compile worker that imported Triton and launched nothing)
        is left out, and its trace removed."""
        del self._followed[followed.path]
        for _ in followed.rest():
            pass
        followed.close()
        followed.write_failure()
        analysis = followed.analysis
        child = None
        if analysis.translator.ops or followed.failed:
            child = _child(followed, self.disk_mb)
        elif analysis.trace_path is not None:
            with contextlib.suppress(OSError):
                analysis.trace_path.unlink()
        self._ended[followed.path] = child

    def finish(self) -> list[Child]:
        """Once the program and its children have ended: each child analysed to its file's
        end, in the order of their files' names."""
        for followed in self.followed():
            self._end(followed)
        return [child for _, child in sorted(self._ended.items()) if child is not None]


def _ended(followed: Followed) -> bool:
    """Whether a child's process is gone (its file then holds all it will write)."""
    pid = followed.analysis.translator.hello.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process by now: not ours to judge
        return False
    return False


def _child(followed: Followed, disk_mb: int) -> Child:
    """A child's analysis, as the run's summary holds it."""
    analysis = followed.analysis
    translator = analysis.translator
    pid, role = translator.hello.get("pid"), str(translator.hello.get("role") or
                                                 "a Python child")
    who = f"in child process {pid} ({role})"
    findings = []
    for finding in followed.findings():
        as_json = finding.to_json()
        as_json["missing"] = f"{who}: {as_json['missing']}"
        findings.append(as_json)
    notes = [f"{who}: {note}" for note in translator.notes]
    if disk := followed.disk_note(disk_mb):
        notes.append(f"{who}: {disk}")
    if followed.failed:
        notes.append(f"{who}: {followed.failure_note()}")
    trace = None if analysis.lost or analysis.trace_path is None else \
        analysis.parts_kept[0] if analysis.parts_kept else analysis.trace_path
    return Child(pid, role, str(followed.path), translator.ops, findings, notes,
                 translator.delays, None if trace is None else str(trace), followed.failed)


def analyse_children(folder: Path) -> list[Child]:
    """Every child's events file in ``folder``, each analysed on its own, once all have
    ended (:meth:`ChildWatch.finish`)."""
    return ChildWatch(folder).finish()
