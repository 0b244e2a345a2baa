"""The scenario model: what a scenario file says, as frozen records.

``harness/lang/scenario.py`` builds these from YAML (with file:line:col errors); the executor, the
runner and the reports only ever see these records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import kvcore
# Where a scenario said something: the errors' record, kept here too for the code that reads
# it from the model.
from harness.errors import Location

STREAM_KINDS = ("non-blocking", "blocking", "legacy")
"""What a declared stream can be: non-blocking (what engines create; no implicit ordering with
the legacy stream), blocking (implicitly ordered with the legacy stream both ways), or the
legacy default stream itself (stream 0)."""

EXPECTATIONS = ("clean", "reproduces", "hang")
"""What a variant must do: stay clean, reproduce the race (manifest or be detected), or hang (a
hang is no reproduction of a race; a scenario that means to hang says so)."""

WORKLOAD_PHASES = ("churn", "prefill", "activate", "decode")
"""The phases of a workload's request, in the order they run; ``amplify.before`` names one."""


@dataclass(frozen=True)
class StreamSpec:
    """A stream a scenario declares: its name (what steps and findings call it), its kind and
    CUDA priority (lower runs first; no ordering guarantee)."""

    name: str
    kind: str = "non-blocking"
    priority: int = 0


DEFAULT_STREAMS = (StreamSpec("compute"), StreamSpec("transfer"), StreamSpec("legacy", "legacy"))
"""The streams of a scenario that declares none: an engine's two non-blocking streams and the
legacy default stream."""

STREAM_ALIASES = {"stream": "compute", "transfer_stream": "transfer", "legacy_stream": "legacy"}
"""kvcore's names for the default streams, accepted where no streams are declared."""


@dataclass(frozen=True)
class Step:
    """One step: ``op`` and its arguments; ``id`` names it for amplification and for leases or
    catalogs it creates. ``only`` lists the variants it runs in (None: all of them)."""

    op: str
    args: dict[str, object]
    id: str | None = None
    index: int = 0
    where: Location | None = None
    only: frozenset[str] | None = None
    thread: str | None = None  # the host thread it runs on; None: the scenario's own thread

    @cached_property
    def label(self) -> str:
        return self.id or f"{self.index}:{self.op}"

    def runs_in(self, variant: str) -> bool:
        return self.only is None or variant in self.only

    @cached_property
    def origin(self) -> str | None:
        """``file:line:col`` of the step in its scenario file, for findings."""
        w = self.where
        return None if w is None else f"{w.file}:{w.line}:{w.column}"


@dataclass(frozen=True)
class Variant:
    """One way to run a scenario: the defects switched on, and what must happen."""

    name: str
    defects: kvcore.Defects = field(default_factory=kvcore.Defects)
    expect: str = "clean"
    min_rate: float = 0.0
    streams: tuple[tuple[str, str], ...] = ()  # (stream, kind): this variant's kinds


@dataclass(frozen=True)
class Amplify:
    """A delay of ``delay_us`` queued on ``stream`` just before step ``before`` (or, in a
    workload, before phase ``before``): it widens the race window so the race shows at once.
    ``stream`` None: the stream of step ``before`` itself, in each variant. ``sweep`` lists
    delays to map the window with ``--sweep``. ``hold`` names steps of host threads: a thread
    whose next step is held waits while another thread can go on, and when every thread waits
    at a held step, the one first in ``hold`` goes on (on the GPU, a thread sleeps ``delay_us``
    times its step's place in ``hold``, from 1): the windows between host threads, widened."""

    delay_us: float
    stream: str | None
    before: str
    sweep: tuple[float, ...] = ()
    hold: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlaneSpec:
    dtype: str
    leading: int
    heads: int
    align: int = 256


@dataclass(frozen=True)
class PoolSpec:
    pages: int
    page_tokens: int = 64
    planes: tuple[PlaneSpec, ...] = (PlaneSpec("i8", 8, 2, 256),)
    table_rows: int = 4
    max_pages_per_row: int = 0  # 0: as many as the pool has
    allocator: str = "fenced"  # kvcore.pool.ALLOCATORS

    def geometry(self) -> kvcore.KVPageGeometry:
        return kvcore.KVPageGeometry(
            tuple(kvcore.KVPlaneGeometry(kvcore.DType.parse(p.dtype), p.leading, p.heads, p.align)
                  for p in self.planes),
            page_tokens=self.page_tokens,
        )


@dataclass(frozen=True)
class Workload:
    """A request-level workload. ``conversation``: ``requests`` turns of one conversation whose
    pages stay retained in its catalog and are re-activated every turn (``pages_per_turn`` new
    pages each), while a second lane materializes, writes and releases ``churn_pages`` pages per
    request. ``ticket``: the requests of a recorded ticket (``ticket``, a gpurace.ticket/1 file),
    replayed over its lanes."""

    kind: str = "conversation"
    requests: int = 50
    initial_pages: int = 4
    pages_per_turn: int = 1
    churn_pages: int = 2
    ticket: Path | None = None


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario file."""

    name: str
    path: Path
    description: str
    dangerous: bool
    pool: PoolSpec
    trials: int
    timeout_s: float
    variants: tuple[Variant, ...]
    amplify: Amplify | None
    steps: tuple[Step, ...] = ()
    workload: Workload | None = None
    tags: tuple[str, ...] = ()
    replay_defects: tuple[str, ...] | None = None  # set for `gpurace replay TICKET --defect ...`
    streams: tuple[StreamSpec, ...] = DEFAULT_STREAMS
    declared_streams: bool = False  # spec.streams was written (else the default three)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    def endless_step(self) -> Step | None:
        """A step that never ends (``delay`` with ``us: .inf``): only a watchdog ends its
        trial, so what runs trials in its own process (explore, minimize) refuses it."""
        return next((s for s in self.steps if s.op == "delay"
                     and math.isinf(float(s.args["us"]))), None)  # type: ignore[arg-type]

    def steps_of(self, variant: str) -> tuple[Step, ...]:
        """The steps ``variant`` runs, in order."""
        return tuple(s for s in self.steps if s.runs_in(variant))

    def streams_of(self, variant: Variant) -> tuple[StreamSpec, ...]:
        """The scenario's streams with ``variant``'s kinds applied."""
        kinds = dict(variant.streams)
        return tuple(StreamSpec(s.name, kinds.get(s.name, s.kind), s.priority)
                     for s in self.streams)

    def amplified_stream(self, variant: str) -> str | None:
        """The stream the amplifying delay goes to in ``variant``."""
        amp = self.amplify
        if amp is None or amp.stream is not None:
            return None if amp is None else amp.stream
        step = next((s for s in self.steps_of(variant) if s.id == amp.before), None)
        return None if step is None else str(step.args["stream"])


@dataclass(frozen=True)
class Suite:
    """A named list of scenario files."""

    name: str
    path: Path
    description: str
    scenarios: tuple[Path, ...]
