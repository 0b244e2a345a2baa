"""The scenario model: what a scenario file says, as frozen records.

``harness/scenario.py`` builds these from YAML (with file:line:col errors); the executor, the
runner and the reports only ever see these records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import kvcore

STREAMS = {
    "compute": "stream",
    "stream": "stream",
    "transfer": "transfer_stream",
    "transfer_stream": "transfer_stream",
    "legacy": "legacy_stream",
    "legacy_stream": "legacy_stream",
}
"""Stream names a scenario may use, mapped to the DeviceContext attribute they mean."""

EXPECTATIONS = ("clean", "reproduces")

STEP_OPS: dict[str, dict[str, tuple[str, ...]]] = {
    # op: {"required": keys, "optional": keys}; every step may also have "id" and "op".
    "materialize": {"required": ("pages",), "optional": ()},
    "release": {"required": ("lease",), "optional": ()},
    "host_fill": {"required": ("buffer", "byte"), "optional": ("pages",)},
    "copy_from_host": {"required": ("src", "dst", "stream"), "optional": ()},
    "copy_to_host": {"required": ("src", "dst", "stream"), "optional": ()},
    "copy_page": {"required": ("src", "dst", "stream"), "optional": ()},
    "zero_pages": {"required": ("lease", "stream"), "optional": ()},
    "catalog": {"required": (), "optional": ()},
    "retain": {"required": ("catalog", "lease"), "optional": ()},
    "bind": {"required": ("catalog",), "optional": ()},
    "publish": {"required": ("catalog", "stream"), "optional": ()},
    "activate": {"required": ("catalog", "stream"), "optional": ()},
    "read_table": {"required": ("catalog", "stream"), "optional": ("assert",)},
    "record_event": {"required": ("event", "stream"), "optional": ()},
    "wait_event": {"required": ("event", "stream"), "optional": ()},
    "synchronize": {"required": (), "optional": ("stream",)},
    "delay": {"required": ("stream", "us"), "optional": ()},
    # check: exactly one of lease (device pages, read back) / buffer (a host buffer), and exactly
    # one of equals (a host buffer's payload) / byte (every payload byte).
    "check": {"required": (), "optional": ("lease", "buffer", "equals", "byte")},
}
"""The step vocabulary (kvcore's nouns) and the keys each step takes."""

WORKLOAD_PHASES = ("churn", "prefill", "activate", "decode")
"""The phases of a workload's request, in the order they run; ``amplify.before`` names one."""


@dataclass(frozen=True)
class Location:
    """Where something was written: file, 1-based line and column, and its path in the
    document (``spec.steps[3].stream``)."""

    file: str
    line: int
    column: int
    path: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.path}"


@dataclass(frozen=True)
class Step:
    """One step: ``op`` and its arguments; ``id`` names it for amplification and for leases or
    catalogs it creates."""

    op: str
    args: dict[str, object]
    id: str | None = None
    index: int = 0
    where: Location | None = None

    @property
    def label(self) -> str:
        return self.id or f"{self.index}:{self.op}"


@dataclass(frozen=True)
class Variant:
    """One way to run a scenario: the defects switched on, and what must happen."""

    name: str
    defects: kvcore.Defects = field(default_factory=kvcore.Defects)
    expect: str = "clean"
    min_rate: float = 0.0


@dataclass(frozen=True)
class Amplify:
    """A delay of ``delay_us`` queued on ``stream`` just before step ``before`` (or, in a
    workload, before phase ``before``): it widens the race window so the race shows at once.
    ``sweep`` lists delays to map the window with ``--sweep``."""

    delay_us: float
    stream: str
    before: str
    sweep: tuple[float, ...] = ()


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

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)


@dataclass(frozen=True)
class Suite:
    """A named list of scenario files."""

    name: str
    path: Path
    description: str
    scenarios: tuple[Path, ...]
