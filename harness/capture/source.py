"""What every capture source is: a framework's work, said in the capture vocabulary.

A source watches one framework inside the program's process (PyTorch's dispatcher, CuPy's
Python surface; next, Triton's launches, CUDA graph replays, NCCL's collectives). Each lives in
a module ``harness.capture.<name>_source`` whose ``SOURCE`` is a :class:`Source`, and its name
in :data:`REGISTERED`; the capture's boot (``harness.capture.boot``) and the pytest plugin's
watch (``harness.capture.in_process``) switch on every source the program can use through this
shape alone, in one loop, never by name.

A source never breaks the program: a failure of its own code is caught where it happens, the
program's call runs unwatched, and the failure goes to the source's :class:`Failures`, which
says each kind once in the run's notes as it is first met and counts them all when the source
stops.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from harness.capture.amplify import Amplifier
from harness.capture.events import Sink

FRAMEWORKS = {"torch": "torch", "cupy": "cupy", "triton": "triton"}
"""Each source's name, and the framework module whose import switches it on."""

REGISTERED = tuple(FRAMEWORKS)
"""The sources, in the order they are switched on (``hello`` lists them in this order)."""

KINDS_KEPT = 20
"""Kinds of failure a run's notes list one by one; the rest are counted together."""


class Failures:
    """What a source could not read, counted: each kind said once in the notes as it first
    happens, and with its count when the capture stops. The program never sees these."""

    def __init__(self, emit: Callable[[list[Any]], None], who: str) -> None:
        self.emit = emit
        self.who = who  # how the notes name the source: "the CuPy source"
        self.counts: dict[str, int] = {}

    def failed(self, where: str, exc: BaseException) -> None:
        text = str(exc).strip().splitlines()
        key = f"{where}: {type(exc).__name__}" + (f": {text[0][:160]}" if text else "")
        if key not in self.counts and len(self.counts) >= KINDS_KEPT:
            key = "other ops (more kinds of failure than are listed one by one)"
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        if n == 0:
            self.emit(["note", f"{self.who} could not read {key}; those ops ran unwatched "
                               "(counted at the end)"])

    def summary(self) -> list[str]:
        return [f"{self.who} could not read {key} ({n} time{'s' if n != 1 else ''}); "
                "those ops ran unwatched" for key, n in self.counts.items()]

    def say_summary(self) -> None:
        """The counts, one note a kind: what the source says as it stops."""
        for line in self.summary():
            self.emit(["note", line])


@dataclass(frozen=True, slots=True)
class Installed:
    """A source switched on: calling it switches the source off (its hooks out, its counts
    said, what it holds written out)."""

    stop: Callable[[], None]
    failures: Failures
    capture: Any = None  # the source's own state, for its tests and the op-cost tool

    def __call__(self) -> None:
        self.stop()


class Source(Protocol):
    """One framework's source. ``name`` is what the ``source`` event and every event's
    ``source`` field say; ``module`` is the framework's top-level module, whose import switches
    the source on; ``title`` is the framework as a person names it (``PyTorch``)."""

    name: str
    module: str
    title: str

    def available(self) -> str | None:
        """The framework's version when it imports here, else None (never raises)."""
        ...

    def install(self, sink: Sink, amplifier: Amplifier | None = None) -> Installed:
        """Watch the framework's work into ``sink`` from now on, queueing the delays
        ``amplifier`` asks for; returns what stops it. Never called twice without a stop."""
        ...


class Deferred:
    """A registered source known by its name and framework alone: its own module (and what
    that imports) is loaded only when it is first asked to start, so a process that never
    imports the framework (a watched program's child) pays nothing for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.module = FRAMEWORKS[name]

    @property
    def title(self) -> str:
        return load(self.name).title

    def available(self) -> str | None:
        return load(self.name).available()

    def install(self, sink: Sink, amplifier: Amplifier | None = None) -> Installed:
        return load(self.name).install(sink, amplifier)


def readiness() -> tuple[list[dict[str, Any]], str]:
    """For ``gpurace doctor``: each source, whether its framework imports in this interpreter
    (with its version), and the verdict's line on ``gpurace watch``."""
    checks, here = [], []
    for name in REGISTERED:
        source = load(name)
        version = source.available()
        if version is not None:
            here.append(source.title)
        checks.append({"name": f"watch: {source.title}", "ok": version is not None,
                       "detail": f"{source.title} {version} imports here" if version else
                       f"{source.title} does not import in this interpreter"})
    line = ("watch: sees " + ", ".join(here) + " in programs run by this interpreter"
            if here else "watch: no framework it watches imports in this interpreter") + (
        "; `gpurace watch -- PYTHON prog.py` watches with the interpreter that runs the "
        "program, and each run in its run.json names the sources that watched it")
    return checks, line


def load(name: str) -> Source:
    """The source called ``name`` (its module imported; the framework is not)."""
    module = importlib.import_module(f"harness.capture.{name}_source")
    source: Source = module.SOURCE
    return source
