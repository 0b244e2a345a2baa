"""The watched program's process: what it is, how each run starts, where its output goes,
and how it ends.

:class:`Program` is the command after ``--``, as :func:`parse_command` reads it.
:class:`Launcher` starts a run as a fresh interpreter under :mod:`harness.capture.boot`, or
forks it from a server that has the program's libraries imported already. :class:`OutputLog`
and :func:`pump` pass the program's output through to ours as it comes and keep a copy in its
log. :func:`stop` ends the program and whatever it started.
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from dataclasses import dataclass
from typing import IO, Any

from harness.capture.events import LOST
from harness.capture.forkserver import ForkServer
from harness.errors import WatchError
from harness.faults.writes import reason

KILL_GRACE_S = 5.0
"""Seconds a program past its timeout has to end after SIGTERM before it is killed."""
_HARNESS_PARENT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Program:
    """What to run: the interpreter, and a script or a module with its arguments."""

    python: str
    target: str
    args: tuple[str, ...]
    module: bool = False
    flags: tuple[str, ...] = ()  # the interpreter's own (python -X dev -u prog.py)

    @property
    def name(self) -> str:
        stem = self.target if self.module else Path(self.target).stem
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", stem)[:64].strip("-.") or "program"
        return name if name[0].isalnum() else "p" + name[:63]

    @property
    def argv(self) -> list[str]:
        return [self.python, *self.flags, *(["-m"] if self.module else []), self.target,
                *self.args]


def parse_command(command: Sequence[str]) -> Program:
    """The program in ``command`` (what follows ``--``): ``python PROG.py ARGS``, ``python -m
    MODULE ARGS``, or a Python script run as a command (``./serve.py``, or an installed one on
    the PATH: ``torchrun``, ``accelerate``), run with the interpreter its ``#!`` line names, as
    a shell would run it. A script named bare (``serve.py``, here) or without a ``#!`` line runs
    with this interpreter."""
    if not command:
        raise WatchError("no program to watch: give it after --, as in `gpurace watch -- "
                         "python serve.py`")
    words = list(command)
    python = sys.executable
    flags: list[str] = []
    if _is_python(words[0]):
        python = words.pop(0)
        while words and words[0].startswith("-") and words[0] != "-m":
            flag = words.pop(0)
            if flag == "-c":
                raise WatchError("python -c is not watched: put the code in a file, and "
                                 "watch `python FILE.py`")
            flags.append(flag)
            if flag in ("-X", "-W") and words:  # the flags that take a word after them
                flags.append(words.pop(0))
    elif words:  # a script: ./serve.py, torchrun on the PATH, or serve.py here
        target, as_command = _script(words[0])
        shebang = _shebang(target)
        if shebang is None and as_command and not target.endswith(".py"):
            raise WatchError(f"{words[0]}: not a Python program ({target} has no #! line "
                             "naming a Python); gpurace watch runs Python programs that use "
                             "PyTorch or CuPy (`gpurace watch -- python serve.py`)")
        if shebang is not None and as_command:  # as a shell would run it
            python, *shebang_flags = shebang
            flags += shebang_flags
        return Program(python, target, tuple(words[1:]), flags=tuple(flags))
    if not words:
        raise WatchError(f"{shlex.join(command)}: no program after the interpreter; give a "
                         "script (python serve.py) or a module (python -m pkg.serve)")
    if words[0] == "-m":
        if len(words) < 2:
            raise WatchError("python -m needs a module name, as in `python -m pkg.serve`")
        return Program(python, words[1], tuple(words[2:]), module=True, flags=tuple(flags))
    target = words[0]
    if not Path(target).is_file():
        raise WatchError(f"{target}: no such file")
    return Program(python, target, tuple(words[1:]), flags=tuple(flags))


_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")  # an interpreter's file name


def _is_python(word: str) -> bool:
    return _PYTHON.fullmatch(Path(word).name) is not None or \
        os.path.realpath(word) == os.path.realpath(sys.executable)


def _script(word: str) -> tuple[str, bool]:
    """The file a command's first word names, and whether a shell would run it as a command
    (through its #! line): a path (``./serve.py``) or a command on the PATH (``torchrun``) is
    one; a bare name of a file here (``serve.py``) is a script for this interpreter."""
    if os.sep in word:
        if not Path(word).is_file():
            raise WatchError(f"{word}: no such file")
        return word, os.access(word, os.X_OK)
    found = shutil.which(word)
    if found is not None:
        return found, True
    if Path(word).is_file():
        return word, False
    raise WatchError(f"{word}: no such file, nor a command on the PATH; give a Python "
                     "script, or `python -m MODULE` (`gpurace watch -- python serve.py`)")


def _shebang(path: str) -> list[str] | None:
    """The interpreter and its flags that a script's ``#!`` line names (None: no such line;
    a line naming another interpreter is refused): on the line itself (``#!/venv/bin/python3
    -u``), through ``env`` (``#!/usr/bin/env python3``), or through pip's trampoline where the
    path is too long for ``#!`` (``#!/bin/sh``, then ``'''exec' "/venv/bin/python" "$0"
    "$@"``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1024).decode("utf-8", "replace").splitlines()[:2]
    except OSError as exc:
        raise WatchError(f"{path}: cannot read it ({reason(exc)})") from None
    if not head or not head[0].startswith("#!"):
        return None
    words = head[0][2:].split()
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-") or _is_python(w)]
        if words and _is_python(words[0]) and os.sep not in words[0]:
            words[0] = shutil.which(words[0]) or words[0]
    elif words and Path(words[0]).name == "sh" and len(head) > 1:
        exec_line = re.match(r"'{3}exec' \"?([^\"\s]+)", head[1])
        words = [exec_line.group(1)] if exec_line else []
    if not words or not _PYTHON.fullmatch(Path(words[0]).name):
        raise WatchError(f"{path}: not a Python program (its #! line names "
                         f"{head[0][2:].strip()!r}); gpurace watch runs Python programs that "
                         "use PyTorch or CuPy: watch the Python command the script runs")
    return [words[0], *(w for w in words[1:] if w.startswith("-"))]


class Launcher:
    """Starts the program's runs: the first (and every one, with ``fresh``) as a fresh
    interpreter, the others forked from a fork server that has imported the libraries the first
    run imported (:mod:`harness.capture.forkserver`); where that server cannot serve, one that
    imported only the frameworks the capture switched on, and where neither can, fresh."""

    def __init__(self, program: Program, extra_env: Mapping[str, str], fresh: bool,
                 note: Any) -> None:
        self.program = program
        self.note = note
        self.server: ForkServer | None = None
        self.modules: tuple[str, ...] | None = None  # what the first run imported
        self.frameworks: tuple[str, ...] = ()  # what its capture switched on
        self.forks = not fresh and hasattr(os, "fork")  # runs after the first may
        self.tried = False
        env = dict(os.environ)
        env.update(extra_env)
        # The program's interpreter finds gpurace's capture package where this one has it,
        # without the rest of this environment's packages.
        env["PYTHONPATH"] = os.pathsep.join([str(_shim()),
                                             *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.env = env

    @property
    def learning(self) -> bool:
        """Whether the next run should name the libraries it imports (the boot's
        ``--libraries``): a server will be made from them."""
        return self.modules is None and self.forks

    def learn(self, sources: dict[str, Any], libraries: Sequence[str]) -> None:
        """What a run's capture switched on, and the libraries it imported."""
        if self.modules is None:
            self.frameworks = tuple(sorted(s for s in sources if s in ("torch", "cupy")))
            self.modules = (tuple(libraries) or self.frameworks) if self.frameworks else ()

    def start(self, boot_args: list[str]) -> tuple[Any, str]:
        """The run's process (as a Popen) and how it started: "forked" or "fresh"."""
        program = self.program
        if not self.tried and self.modules and self.forks:
            self.tried = True
            for modules in dict.fromkeys([self.modules, self.frameworks]):
                try:
                    self.server = ForkServer(program.python, program.flags, self.env, modules)
                    break
                except OSError as exc:
                    fallback = modules != self.frameworks
                    self.note(f"the fork server of {len(modules)} library module(s) did not "
                              f"start ({exc}); trying one of {', '.join(self.frameworks)} only"
                              if fallback else "runs start as fresh interpreters: the fork "
                              f"server did not start ({exc})")
        if self.server is not None:
            try:
                return self.server.start(boot_args, self.env, os.getcwd()), "forked"
            except OSError as exc:
                self.note(f"runs start as fresh interpreters from here: the fork server "
                          f"failed ({exc})")
                self.close()
        argv = [program.python, *program.flags, "-m", "harness.capture.boot", *boot_args]
        # Its own session: a timeout ends the program and whatever it started, and a Ctrl-C
        # reaches it through us. Its input is ours, as if it ran alone.
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=self.env, start_new_session=True), "fresh"

    def close(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            server.close()


class OutputLog:
    """The program's output, kept in program.log as it comes. A disk that will not take it
    costs the log, never the program (whose pipes are drained all the same); the line a
    capture says when it cannot write its events (:data:`LOST`) is looked for on the way."""

    def __init__(self, path: Path) -> None:
        self.lost = ""
        self.events_lost = ""
        self._seen = b""  # the end of the last chunk: LOST may be cut between two
        self._lock = threading.Lock()  # both pumps write here
        self._file: IO[bytes] | None = None
        try:
            # Unbuffered: the pumps write whole chunks, and a full disk says so at once.
            self._file = open(path, "wb", buffering=0)  # noqa: SIM115
        except OSError as exc:
            self.lost = reason(exc)

    def write(self, chunk: bytes, errors: bool) -> None:
        with self._lock:
            self._write(chunk, errors)

    def _write(self, chunk: bytes, errors: bool) -> None:
        if errors:
            text = self._seen + chunk
            at = text.find(_LOST)
            if at >= 0 and not self.events_lost:
                line = text[at + len(_LOST):].split(b"\n", 1)[0]
                self.events_lost = line.decode("utf-8", "replace").strip() or "unknown"
            self._seen = text[-len(_LOST) - 200:]
        if self._file is not None:
            try:
                self._file.write(chunk)
            except OSError as exc:
                self.lost = reason(exc)
                self._close()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self.lost = self.lost or reason(exc)
            self._file = None


_LOST = LOST.encode()


def pump(src: IO[bytes], dst: IO[bytes], log: OutputLog, tail: list[bytes] | None) -> None:
    """Copy the program's output to ours and to its log, as it comes (``tail``: its standard
    error's last chunks)."""
    for chunk in iter(lambda: src.read1(65536), b""):  # type: ignore[attr-defined]
        try:
            dst.write(chunk)
            dst.flush()
        except (OSError, ValueError):
            pass  # our own output closed: the log still gets it
        log.write(chunk, errors=tail is not None)
        if tail is not None:
            tail.append(chunk)
            while len(tail) > 64:
                del tail[0]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the program's whole process group: SIGTERM, then SIGKILL after a grace."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


_SHIM: list[Path] = []


def _shim() -> Path:
    """A folder that holds only a link to gpurace's ``harness`` package: on the program's
    PYTHONPATH, it lets the program's interpreter import the capture without the rest of the
    environment gpurace was installed into."""
    if not _SHIM:
        shim = Path(tempfile.mkdtemp(prefix="gpurace-watch-"))
        (shim / "harness").symlink_to(_HARNESS_PARENT / "harness", target_is_directory=True)
        _SHIM.append(shim)
        # Gone with the watch: its programs have ended by then.
        atexit.register(shutil.rmtree, shim, ignore_errors=True)
    return _SHIM[0]
