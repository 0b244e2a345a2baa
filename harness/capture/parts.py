"""Where the capture's time goes in a watched program, by part, from a profile of the program.

``python -m cProfile -o F program.py`` run under `gpurace watch` profiles the program with the
capture in it. :func:`split` takes that profile's functions apart: the capture's own, each to
the part of its work it belongs to (the mode's entry, reading an op's tensors and stream, the
walk out to the program's line, naming, PyTorch's callbacks, the sink, ...), and what PyTorch
runs in Python only because a dispatch mode is on. The program's own time and the rest of
PyTorch's are left out. cProfile slows what it times, and small functions most, so the parts
are compared with each other, not added to a run's time.

    python tests/real_programs/parts.py --only fsdp2_train      (a corpus program, on a GPU)
    python -m harness.capture.opcost --parts                     (a loop of one op)
"""

from __future__ import annotations

from typing import Any, NamedTuple

MODE = "the mode's entry (dispatch mode, op plans)"
TENSORS = "the op's tensors, stream and event"
LINE = "the program's line (stack walk)"
NAMING = "names of tensors and streams"
CALLBACKS = "PyTorch's callbacks (frees, events, waits)"
SINK = "the sink (event lines to the file)"
LIBRARIES = "collectives, graphs, Triton, patched calls"
OTHER = "the rest of gpurace"
PYTORCH = "PyTorch's Python dispatch for a mode"
ORDER = (MODE, TENSORS, LINE, NAMING, CALLBACKS, SINK, LIBRARIES, OTHER, PYTORCH)
"""The parts, in the order a table shows them."""

_BY_FILE = {
    "torch_source.py": MODE, "torch_mode.py": MODE, "torch_ops.py": TENSORS,
    "sites.py": LINE, "events.py": SINK, "torch_collectives.py": LIBRARIES,
    "torch_graphs.py": LIBRARIES, "torch_patches.py": LIBRARIES,
    "torch_functional.py": LIBRARIES, "triton_source.py": LIBRARIES,
    "triton_ir.py": LIBRARIES, "spin.py": LIBRARIES,
}
"""A capture file's part, where the whole file is one part."""

_BY_FUNCTION = {
    # torch_capture.py holds several parts; its functions say which.
    "name_pending": NAMING, "name_when_quiet": NAMING, "stream": NAMING, "plan": MODE,
    # sites.py: naming, apart from its walk.
    "variable_for": NAMING, "names_in": NAMING, "is_own_code": NAMING,
    # torch_ops.py: a new tensor's description, for its allocation's name.
    "what_of": NAMING, "decomposes": MODE,
}
"""A function's part where its file holds more than one."""

_MEASURING = ("opcost.py",)
"""gpurace's files that are the program being measured (opcost's loop of ops), not its cost."""

_PYTORCH_FILES = ("torch/utils/_python_dispatch.py", "torch/_library/simple_registry.py")
"""PyTorch's Python code that runs for an op only while a dispatch mode is on."""


class PartTime(NamedTuple):
    """One part's functions over a profile: their own time and their calls."""

    part: str
    own_s: float
    calls: int


def part_of(path: str, function: str) -> str | None:
    """The part a profiled function belongs to, or None (the program's, a library's)."""
    path = path.replace("\\", "/")
    if any(path.endswith(name) for name in _PYTORCH_FILES):
        return PYTORCH
    if "/harness/" not in path:
        return None
    name = path.rsplit("/", 1)[-1]
    if name in _MEASURING:
        return None
    if function in _BY_FUNCTION and name in ("torch_capture.py", "sites.py", "torch_ops.py"):
        return _BY_FUNCTION[function]
    if name == "torch_capture.py":
        return CALLBACKS if function.startswith(("on_", "_edge", "_wait_edge", "host_read")) \
            else TENSORS
    return _BY_FILE.get(name, OTHER)


def split(stats: dict[Any, Any]) -> list[PartTime]:
    """The parts of a profile (``pstats.Stats(...).stats``: ``(file, line, function) ->
    (calls, primitive calls, own time, cumulative time, callers)``), in :data:`ORDER`, those
    with no time left out."""
    own: dict[str, float] = {}
    calls: dict[str, int] = {}
    for (path, _line, function), (_, ncalls, tottime, _cum, _callers) in stats.items():
        part = part_of(path, function)
        if part is not None:
            own[part] = own.get(part, 0.0) + tottime
            calls[part] = calls.get(part, 0) + ncalls
    return [PartTime(part, own[part], calls[part]) for part in ORDER if own.get(part)]


def table(parts: list[PartTime], ops: int, total_s: float) -> str:
    """The parts as a Markdown table: own milliseconds, microseconds a captured op, and each
    part's share of the capture's whole (PyTorch's mode dispatch apart). ``total_s`` is the
    whole profile's own time, the program's included."""
    ours = sum(p.own_s for p in parts if p.part != PYTORCH)
    lines = ["| part | own ms (profiled) | µs a captured op | share of gpurace's |",
             "|---|---|---|---|"]
    for p in parts:
        share = "-" if p.part == PYTORCH or not ours else f"{p.own_s / ours:.0%}"
        lines.append(f"| {p.part} | {p.own_s * 1e3:,.1f} | {p.own_s / max(1, ops) * 1e6:.2f} "
                     f"| {share} |")
    lines.append(f"\n{ops:,} ops captured; gpurace's own {ours * 1e3:,.1f} ms of "
                 f"{total_s * 1e3:,.1f} ms profiled in the program's process "
                 f"({ours / total_s:.0%})." if total_s else "")
    return "\n".join(lines)
