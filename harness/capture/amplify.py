"""Delays queued before a watched program's racing ops, so their race window opens.

A race the detector finds in the program's happens-before order may not show in its answers:
the op that should come second usually ends up second anyway. A *delay* is a spin kernel queued
on an op's own stream just before it: everything after it on that stream waits, the other
stream's op, which nothing orders against it, runs first, and the program's answer shows what
the race does. Only the stream the delay is queued on waits; the host goes on at once.

Both sides of the watch use this module. The watching side plans delays from a run's findings
(:func:`plan`: the earlier op of each racing pair, at its ``file:line`` and of its kind, for at
least :data:`GAP_FACTOR` times the host's time between the pair's ops in that run) or
parses the user's ``--amplify FILE:LINE`` (:func:`parse_site`), and hands them to the watched
process as JSON. There a source asks :class:`Amplifier` before each op it sees whether to queue
a delay before it, and says how many it queued. Nothing here imports PyTorch or CuPy.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from harness.races.kinds import GRAPH_BRANCH

DELAY_US = 1000.0
"""The delay's length by default: a millisecond outlasts a launch's latency and most kernels
of a small program, and is short enough to queue before every occurrence of a site."""

GAP_FACTOR = 3.0
"""A planned delay lasts at least this many times the host's time, in the run that found the
race, from issuing the pair's first op to its second: the delay must outlast the host's way to
the second op, and a host slowed by other work takes longer than it did then."""

PLANNED_MAX_US = 1_000_000.0
"""The longest delay a plan lengthens to: a second, queued before each occurrence."""

_SITE = re.compile(r"^(?P<path>.+):(?P<line>[0-9]+)$")


@dataclass(frozen=True)
class Delay:
    """Queue ``us`` microseconds of spin on an op's stream before each op issued from the
    program's ``path:line`` (of ``kind``, when given: ``kernel:mm``, ``copy_dtoh``).

    An op a CUDA graph captured is not issued by the program's line at a replay: its delay is
    queued before each replay of the graph, which delays the whole graph against the program's
    other streams; or, ``in_graph``, for a race between two branches of one graph, captured
    into the graph before the op, so that the op's branch waits and the other goes first."""

    path: str
    line: int
    us: float = DELAY_US
    kind: str | None = None
    in_graph: bool = False

    @property
    def site(self) -> str:
        return f"{self.path}:{self.line}"

    def describe(self) -> str:
        what = f"{self.kind} at " if self.kind else ""
        return f"{self.us:g} µs before {what}{self.site}" + (
            " inside its CUDA graph" if self.in_graph else "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Delay:
        return cls(str(data["path"]), int(data["line"]), float(data.get("us", DELAY_US)),
                   data.get("kind"), bool(data.get("in_graph", False)))


def parse_site(text: str, us: float = DELAY_US) -> Delay:
    """``FILE:LINE`` (as a finding names a side) as a delay; ValueError, saying what is
    wrong, for anything else."""
    match = _SITE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not FILE:LINE: name the program's line whose op "
                         "should wait, as a finding names it (serve.py:41)")
    line = int(match["line"])
    if line < 1:
        raise ValueError(f"{text!r}: lines count from 1")
    return Delay(match["path"], line, us)


def encode(delays: Sequence[Delay]) -> str:
    return json.dumps([d.to_json() for d in delays], separators=(",", ":"))


def decode(text: str) -> tuple[Delay, ...]:
    return tuple(Delay.from_json(d) for d in json.loads(text))


@dataclass(frozen=True)
class Target:
    """A racing pair, and the delay that opens its window: queued before the earlier op."""

    delay: Delay
    stream: str  # the earlier op's stream, as the finding names it
    first: str  # the earlier op, in the finding's words: "kernel:mm on prefill at x.py:60"
    second: str
    finding: dict[str, Any]
    gap_us: float | None = None  # the host's time from the first op's issue to the second's


def plan(findings: Iterable[dict[str, Any]], us: float = DELAY_US,
         issued: dict[int, tuple[int, str | None]] | None = None) -> list[Target]:
    """One target per racing pair of a run's folded findings, in their order, a site and kind
    delayed once however many pairs it begins. A pair whose earlier op is the host's own
    access has no stream to delay: the host's later op cannot be made to come first by a
    delay queued on a stream, so it is left out (:func:`unplanned` says which).

    ``issued`` (seq -> the host's clock at the op's issue, in ns, and its step, from the trace
    of a run that found the races) lengthens a delay to :data:`GAP_FACTOR` times the pair's gap
    where that is longer than ``us`` (at most :data:`PLANNED_MAX_US`); a pair whose ops are not
    that trace's (found in another run) keeps ``us``."""
    targets: list[Target] = []
    seen: set[tuple[str, int, str | None, bool]] = set()
    for f in findings:
        first, second = _ordered(f)
        delay = _delay_for(first, us)
        if delay is None:
            continue
        if _one_graph(str(first.get("stream")), str(second.get("stream"))):
            delay = replace(delay, in_graph=True)
        key = (delay.path, delay.line, delay.kind, delay.in_graph)
        if key in seen:
            continue
        seen.add(key)
        gap = _gap_us(issued or {}, first, second)
        if gap is not None and GAP_FACTOR * gap > delay.us:
            delay = replace(delay, us=round(min(GAP_FACTOR * gap, PLANNED_MAX_US), 1))
        targets.append(Target(delay, str(first.get("stream")), _said(first), _said(second),
                              f, gap))
    return targets


def _gap_us(issued: dict[int, tuple[int, str | None]], first: dict[str, Any],
            second: dict[str, Any]) -> float | None:
    a, b = issued.get(int(first.get("seq", 0))), issued.get(int(second.get("seq", 0)))
    if a is None or b is None or a[1] != first.get("step") or b[1] != second.get("step"):
        return None
    return (b[0] - a[0]) / 1000.0 if b[0] >= a[0] else None


def _one_graph(a: str, b: str) -> bool:
    """Whether two streams are branches of one replay of a CUDA graph (the replay stream and
    its branch streams): a race between them is the graph's own."""
    return (GRAPH_BRANCH in a or GRAPH_BRANCH in b) and \
        a.split(GRAPH_BRANCH)[0] == b.split(GRAPH_BRANCH)[0]


def unplanned(findings: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings :func:`plan` has no delay for."""
    return [f for f in findings if _delay_for(_ordered(f)[0], DELAY_US) is None]


def _ordered(f: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    a, b = f["first"], f["second"]
    return (a, b) if int(a.get("seq", 0)) <= int(b.get("seq", 0)) else (b, a)


def _delay_for(op: dict[str, Any], us: float) -> Delay | None:
    if op.get("stream") in (None, "host") or str(op.get("kind", "")).startswith("host_"):
        return None
    match = _SITE.match(str(op.get("step") or ""))
    if not match:
        return None  # an op no line of the program issued (a library's own thread)
    return Delay(match["path"], int(match["line"]), us, str(op["kind"]) if op.get("kind")
                 else None)


def _said(op: dict[str, Any]) -> str:
    return f"{op.get('kind')} on {op.get('stream')} at {op.get('step')}"


class Amplifier:
    """In the watched process: which ops get a delay, and how many were queued.

    A source calls :meth:`wants` with each stream op's site and kind before it issues the op;
    the answer for a site and kind is worked out once, so an op costs one dict lookup. The
    source queues the delay (its framework's spin kernel) and calls :meth:`queued`."""

    def __init__(self, delays: Sequence[Delay], emit: Callable[[list[Any]], None]) -> None:
        self.delays = tuple(delays)
        self._emit = emit
        self._answers: dict[tuple[str | None, str, bool], Delay | None] = {}
        self.counts: dict[Delay, int] = {d: 0 for d in self.delays}
        self._streams: dict[Delay, set[int]] = {d: set() for d in self.delays}
        self.failures: list[str] = []

    def wants(self, site: str | None, kind: str, in_graph: bool = False) -> Delay | None:
        """The delay to queue before an op at ``site`` of ``kind``; ``in_graph``: the one to
        capture into a CUDA graph before it (for a race between the graph's branches), where
        a delay asked for there is kept apart from one for the op's other races."""
        key = (site, kind, in_graph)
        answer = self._answers.get(key, _UNKNOWN)
        if answer is _UNKNOWN:
            answer = self._answers[key] = self._match(site, kind, in_graph)
        return answer  # type: ignore[return-value]

    def _match(self, site: str | None, kind: str, in_graph: bool) -> Delay | None:
        if site is None:
            return None
        match = _SITE.match(site)
        if not match:
            return None
        path, line = match["path"], int(match["line"])
        for d in self.delays:
            if d.line == line and (d.kind is None or d.kind == kind) and \
                    d.in_graph == in_graph and same_file(path, d.path):
                return d
        return None

    def queued(self, delay: Delay, sid: int | None) -> None:
        self.counts[delay] += 1
        if sid is not None:
            self._streams[delay].add(sid)

    def failed(self, delay: Delay, why: str) -> None:
        """The source could not queue a delay (its spin kernel would not build): said once,
        and that delay is not asked for again."""
        self.failures.append(f"{delay.describe()}: {why}")
        for key, answer in list(self._answers.items()):
            if answer == delay:
                self._answers[key] = None
        self.delays = tuple(d for d in self.delays if d != delay)

    def report(self) -> None:
        """The ``delays`` event: each delay's count and streams (written as the program ends)."""
        self._emit(["delays", [{**d.to_json(), "queued": self.counts[d],
                                "streams": sorted(self._streams[d])}
                               for d in self.counts], self.failures])


_UNKNOWN = object()


def same_file(captured: str, wanted: str) -> bool:
    """Whether a captured site's file (relative to the program's folder when under it) is the
    user's: the same file, or one whose path ends with what the user wrote (``serve.py`` for
    ``pkg/serve.py``)."""
    if captured == wanted:
        return True
    a, b = os.path.abspath(captured), os.path.abspath(wanted)
    if a == b:
        return True
    tail = os.path.normpath(wanted)
    return not os.path.isabs(tail) and a.endswith(os.sep + tail)
