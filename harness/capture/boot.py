"""The watched process: switch the capture sources on, then run the user's program in it.

Run by `gpurace watch` as ``python -m harness.capture.boot --events FILE --sources LIST
[--delays JSON] -- PROGRAM ARGS`` under the program's own interpreter (the one the user named,
which has their PyTorch or CuPy); ``--delays`` are the delays :mod:`harness.capture.amplify`
queues before the program's racing ops. It imports nothing of gpurace but the capture vocabulary
and the sources, so the program runs as it would alone: its ``__main__``, its ``sys.argv``, its
output, its exit status. How it ended goes into the events file last (an uncaught exception's
traceback included), and the process exits with the program's own status.

Exit 77, without running the program, when no source asked for can be switched on (neither
PyTorch nor CuPy imports in this interpreter); exit 2 when the program or module is not there.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.abc
import importlib.util
import os
import runpy
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any

from harness.capture import events as E
from harness.capture.amplify import Amplifier, decode
from harness.capture.backlog import Backlog
from harness.capture.imports import OnExec
from harness.capture.source import REGISTERED, Installed, Source, load

NOTHING_TO_CAPTURE = 77
USAGE = 2

CHILDREN_ENV = "GPURACE_WATCH_CHILDREN"
"""The folder a watched program's Python children write their events files into."""

CHILD_SITE = Path(__file__).resolve().parent / "child_site"
"""The folder whose sitecustomize watches a child (:mod:`harness.capture.children`)."""


DELAYS_ENV = "GPURACE_WATCH_DELAYS"
"""The delays (``--delays``' JSON) a watched program's children queue too."""

BACKLOG_ENV = "GPURACE_WATCH_BACKLOG"
"""The bytes a watched program's child may write ahead of the watch (``--backlog``)."""


def hand_down(events: str, delays: str = "", backlog: int = 0) -> None:
    """Set this process's environment so that its Python children are watched: their events
    beside ``events``, in a ``children`` folder, queueing ``delays`` as the program does (a
    race the watch found in a child is amplified there), each at most ``backlog`` bytes ahead
    of the watch (0: no bound)."""
    os.environ[CHILDREN_ENV] = str(Path(events).resolve().parent / "children")
    for name, value in ((DELAYS_ENV, delays), (BACKLOG_ENV, str(backlog) if backlog else "")):
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(CHILD_SITE), *([path] if path else [])])


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.capture.boot")
    parser.add_argument("--events", required=True)
    parser.add_argument("--sources", default="auto")
    parser.add_argument("--module", action="store_true")
    parser.add_argument("--delays", default="", help="JSON: the delays to queue (amplify)")
    parser.add_argument("--backlog", type=int, default=0,
                        help="bytes of events the program may write ahead of the watch's "
                             "reading (0: no bound)")
    parser.add_argument("--libraries", action="store_true",
                        help="name the library modules the run imported, in its exit event")
    parser.add_argument("program")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def importable(name: str) -> bool:
    """Whether the program could import the framework here (found, not imported: importing
    PyTorch costs seconds, and a CuPy program should not pay for it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


QUIET_S = 0.05
"""A watched process writes the events it holds once none has come for this long (its host
waits write them too): :meth:`harness.capture.events.Sink.flush_when_quiet`."""


class InstallOnImport(OnExec):
    """Switches a source on the moment the program's import of its framework has finished, so
    a program pays for no framework it does not use, and the source sees all of its work.

    Once the process uses the GPU (PyTorch's first use of CUDA, or a source that starts with
    its framework's import), its held events are written whenever it goes quiet: a process
    ended while it waits on something other than the device (a pool worker idle on its task
    queue, ended by SIGTERM; a program the watch ends as hung) loses none of what it did. It
    is not started earlier: a process with a thread of ours that forks before it uses CUDA
    would be told by Python (3.12 on) that forking a threaded process may deadlock."""

    def __init__(self, sink: E.Sink, sources: tuple[Source, ...],
                 amplifier: Amplifier | None = None) -> None:
        super().__init__()
        self.sink = sink
        self.amplifier = amplifier
        self.writing = False  # the sink's writer for quiet times started
        # A framework's module -> the sources its import switches on, in their order.
        self.waiting: dict[str, list[Source]] = {}
        for source in sources:
            self.waiting.setdefault(source.module, []).append(source)
        self.stops: list[Installed] = []

    def executed(self, fullname: str) -> None:
        for source in self.waiting.pop(fullname, ()):
            self.install(source)

    def stop_all(self) -> None:
        """Switch off every source this hook started, the last first; one that cannot stop is
        said in a note, and must not keep the others (or the exit) from being written."""
        for off in reversed(self.stops):
            try:
                off()
            except Exception as exc:
                self.sink.emit(["note", f"a capture source failed to stop: {exc!r}"])

    def install_now(self, module: str) -> None:
        """Switch on the sources of a framework the process has imported already."""
        for source in self.waiting.pop(module, ()):
            self.install(source)

    def install(self, source: Source) -> None:
        try:
            version = source.available()
            if version is None:
                return
            self.stops.append(source.install(self.sink, self.amplifier))
            self.sink.emit(["source", source.name, version])
            if source.name == "torch":
                on_cuda(self.write_when_quiet)
            else:
                self.write_when_quiet()
        except Exception as exc:  # a source that cannot start must not stop the program
            self.sink.emit(["note", f"the {source.name} source could not start ({exc!r}): "
                                    "its work is not watched"])

    def write_when_quiet(self) -> None:
        if not self.writing:
            self.writing = True
            self.sink.flush_when_quiet(QUIET_S)


def on_cuda(start: Any) -> None:
    """Call ``start`` once, when this process first initialises CUDA through PyTorch (its
    ``torch.cuda._lazy_init``, which PyTorch's C++ side calls too), or now if it has."""
    import torch.cuda

    lazy_init = torch.cuda._lazy_init
    started: list[bool] = []

    def init_then_start(*args: Any, **kwargs: Any) -> Any:
        out = lazy_init(*args, **kwargs)
        if not started:
            started.append(True)
            torch.cuda._lazy_init = lazy_init  # once: the program's own from here on
            start()
        return out

    if torch.cuda.is_initialized():
        start()
    else:
        torch.cuda._lazy_init = init_then_start


def watch_forks(sink: E.Sink) -> None:
    """A child the program forks inherits the sources and the events file: it must not write
    to it (its events would tear the parent's lines), and the watch must say it is not seen."""
    said: list[bool] = []

    def before() -> None:
        if not said:
            said.append(True)
            sink.emit(["note", f"the program forked a child process (pid {os.getpid()} "
                               "forked): a forked child is not watched; its CUDA work is "
                               "not seen (a child started by spawn or as a subprocess is)"])
        sink.flush()

    os.register_at_fork(before=before, after_in_child=sink.forked)
    try:
        import multiprocessing.process as mp
    except ImportError:  # pragma: no cover - a Python without multiprocessing
        return
    start = mp.BaseProcess.start

    def noted_start(self: Any) -> None:
        import multiprocessing
        method = getattr(self, "_start_method", None) or multiprocessing.get_start_method(
            allow_none=True) or "fork"
        if method == "fork":
            sink.emit(["note", "the program started worker processes by fork "
                               "(multiprocessing): forked workers are not watched; their "
                               "CUDA work is not seen (spawned workers are)"])
        start(self)

    mp.BaseProcess.start = noted_start  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    opts = _parse(sys.argv[1:] if argv is None else argv)
    sink = E.Sink.to_path(opts.events, Backlog(Path(opts.events), opts.backlog)
                          if opts.backlog else None)
    wanted = REGISTERED if opts.sources == "auto" else tuple(
        s for s in opts.sources.split(",") if s)
    known = {name: load(name) for name in wanted if name in REGISTERED}
    found = tuple(source for source in known.values() if importable(source.module))
    sink.emit(["hello", {"schema": E.CAPTURE_SCHEMA, "pid": os.getpid(),
                         "argv": [opts.program, *opts.args], "cwd": os.getcwd(),
                         "python": sys.version.split()[0], "executable": sys.executable,
                         "importable": [source.name for source in found],
                         "module": opts.module}])
    if not found:
        names = " nor ".join(f"{known[n].title} ({known[n].module})" if n in known else n
                             for n in wanted)
        return _end(sink, NOTHING_TO_CAPTURE,
                    f"{sys.executable} cannot import {names}: gpurace watch captures PyTorch "
                    "and CuPy programs; install torch, or cupy-cuda13x (pip install "
                    "'gpurace[cuda]'), into the interpreter the program runs with")
    if opts.module:
        if not importable(opts.program):
            return _end(sink, USAGE, f"no module named {opts.program!r} for {sys.executable}")
    elif not os.path.isfile(opts.program):
        return _end(sink, USAGE, f"{opts.program}: no such file")
    amplifier = Amplifier(decode(opts.delays), sink.emit) if opts.delays else None
    hook = InstallOnImport(sink, found, amplifier)
    sys.meta_path.insert(0, hook)
    for module in list(hook.waiting):
        if module in sys.modules:  # imported already (a sitecustomize): switch it on now
            hook.install_now(module)
    watch_forks(sink)
    # Its Python children are watched too, each alone.
    hand_down(opts.events, opts.delays, opts.backlog)
    sys.argv = [opts.program, *opts.args]
    status, error, tb = 0, None, None
    try:
        if opts.module:
            runpy.run_module(opts.program, run_name="__main__", alter_sys=True)
        else:
            # As `python prog.py` does: the script's folder first on the path, and its
            # __file__ absolute (a program that changes folder still finds its files).
            path = os.path.abspath(opts.program)
            sys.path.insert(0, os.path.dirname(path))
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:  # the program's own failure, reported as it is
        status, error = 1, f"{type(exc).__name__}: {exc}"
        tb = traceback.format_exc()
        traceback.print_exc()
    finally:
        # As the interpreter does once the main module is done: its non-daemon threads and
        # executors' pending work run to their end, then its exit handlers (a last checkpoint
        # saved there), all still watched.
        _wait_for_threads()
        atexit._run_exitfuncs()
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        if not hook.stops:
            sink.emit(["note", "the program imported neither " + " nor ".join(
                source.name for source in found) + ": nothing of its work was captured"])
        hook.stop_all()
        if amplifier is not None:
            amplifier.report()
    return _end(sink, status, error, tb, libraries=opts.libraries)


def _wait_for_threads() -> None:
    """Wait for the program's non-daemon threads, as a normal exit does before its exit
    handlers (threading's own shutdown, which first tells executors to finish their queued
    work). A program whose thread never ends hangs here as it would alone."""
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        with contextlib.suppress(Exception):  # the program's threads' failure is their own
            shutdown()


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)  # what SystemExit("message") prints
    return 1


def _libraries() -> list[str]:
    """The modules loaded now, in sys.modules' order, that are the interpreter's libraries (its
    standard library and installed packages), not the program's own code nor gpurace's."""
    paths = sysconfig.get_paths()
    # A module's file is named as its sys.path entry names it: the roots as written and as
    # resolved both, so that no module's path needs resolving.
    roots = tuple(sorted({os.path.join(form(paths[key]), "") for key in
                          ("stdlib", "platstdlib", "purelib", "platlib") if key in paths
                          for form in (os.path.abspath, os.path.realpath)}))
    return [name for name, module in list(sys.modules.items())
            if name != "__main__" and name.split(".")[0] != "harness"
            and str(getattr(module, "__file__", None) or "").startswith(roots)]


def _end(sink: E.Sink, status: int, error: str | None, tb: str | None = None,
         libraries: bool = False) -> int:
    sink.emit(["exit", {"status": status, "error": error, "traceback": tb,
                        **({"libraries": _libraries()} if libraries else {})}])
    sink.close()
    return status


def wind_down() -> None:
    """What a normal exit does that the program would see, before ``os._exit`` skips the rest
    (interpreter teardown after a dead CUDA context can hang or crash in library destructors):
    the exit handlers registered since :func:`main` ran them, then every file it still holds
    open flushed (a module's log or results file, which teardown would flush; measured 49-53
    ms over the 223,000 objects of a process that imported transformers), then its standard
    streams."""
    import gc
    import io

    atexit._run_exitfuncs()
    written = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    for obj in gc.get_objects():
        try:  # by its type alone: an object's own __class__ may warn (torch's deprecations)
            if issubclass(type(obj), written) and not obj.closed:
                obj.flush()
        except Exception:  # noqa: BLE001, S110 - a dead weak proxy, a reader gone: as teardown
            pass
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


if __name__ == "__main__":
    code = main()
    wind_down()
    os._exit(code)  # the program's status is what the watch reports
