"""A watched program's race as a scenario: the reproducer a user keeps.

From a watched run's op trace and one of its findings, :func:`reproducer` writes a scenario that
holds the racing pair and what orders, or fails to order, it, in the program's names: its
streams (``prefill``, ``legacy`` for the legacy default stream, ``stream-41`` for one made at line
41 without a name), its tensors and arrays (``kv_cache``; ``tensor-48`` where the program named
none), each op at its line (step ``mm-68`` is the ``kernel:mm`` issued at line 68). Everything else
the program did is left out; what is kept:

* the memory the pair touches: a lease of one page for device memory, a pinned buffer for host
  memory, and for bytes the caching allocator gave back and handed out again, the first owner,
  its release where the program freed it, and the next owner, on the stream it was made on;
* the pair itself. The scenario's ops stand for the program's by what they do to the bytes: a
  write is a kernel writing a byte no other step writes, a device read is a copy to the host (so
  a check can say what the read saw), a pinned buffer's copy is a copy, the host's access a host
  write or a check;
* the event records and waits on the two streams from the host's last synchronize before the
  pair to its second op (a stale record the second op's stream waited for is kept: it is why the
  wait orders nothing);
* a check of what the race decides: what the read saw, or what the bytes hold at the end.

Its ``fixed`` variant carries the fix the finding suggests (an event recorded after the first op
and waited for before the second; a synchronize before the host's access); ``amplify`` queues the
delay before the first op, on its stream, as ``gpurace watch --amplify`` does. Nothing here runs
anything: ``gpurace run`` of the file shows it.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.errors import TraceError
from harness.inputs import Unreadable, read_input
from harness.limits import HEAD_BYTES, REPORT_MAX_BYTES, TRACE_MAX_BYTES

OLD, FIRST, SECOND = 0x5A, 0x11, 0x22
"""The bytes the scenario writes: what the memory holds before the pair, what the first op
writes, what the second writes. None is the byte a fresh page holds."""

_EDGES = ("event_record", "event_wait", "sync_event")


@dataclass
class _Names:
    """Names for the scenario, each once, in the scenario language's pattern."""

    taken: set[str] = field(default_factory=set)

    def new(self, wanted: str) -> str:
        base = re.sub(r"[^a-z0-9_-]+", "-", wanted.lower()).strip("-_")[:48] or "x"
        if not base[0].isalnum():
            base = "x" + base
        name, n = base, 2
        while name in self.taken:
            name, n = f"{base}-{n}", n + 1
        self.taken.add(name)
        return name


DELAY_US = 10_000.0
"""The delay a reproducer's amplified trials queue before its first op. Ten times what
`--amplify` queues in the program: the scenario's trials are short, and a host busy with other
work can stall longer than 1 ms between the two ops of a pair. On an H200 running twelve watched
programs at once, 1 ms reproductions of cupy_pool_reuse and torch_record_stream missed in 2 to
3 of 50 trials, and cupy_pool_reuse's alone in none of 300; the zoo's cub-156 and cudf-22284
needed 10 ms for the same reason."""


@dataclass(frozen=True)
class Reproducer:
    """The scenario's YAML text, and what it came from."""

    text: str
    name: str
    steps: int
    finding: dict[str, Any]
    shape: str  # "write then read", "read then write", ...


def reproducer(records: Sequence[dict[str, Any]], finding: dict[str, Any], *, program: str,
               command: str = "", delay_us: float = DELAY_US) -> Reproducer:
    """The scenario of ``finding`` (a race in the trace ``records``, as the detector folds it)."""
    ops = {int(r["seq"]): r for r in records if r.get("type", "op") == "op" and "seq" in r}
    streams = {str(r["name"]): r for r in records if r.get("type") == "stream"}
    first, second = sorted((finding["first"], finding["second"]), key=lambda o: int(o["seq"]))
    if first["stream"] == "host":
        raise TraceError(f"the race begins with the host's own access at {first.get('step')}: "
                         "no delay on a stream makes the later op come first, so no scenario "
                         "can show it yet")
    a, b = ops.get(int(first["seq"])), ops.get(int(second["seq"]))
    if a is None or b is None:
        raise TraceError(f"the trace holds no op {first['seq']} or {second['seq']}: give the "
                         "trace of the run that found the race")
    names = _Names()
    stream_names: dict[str, str] = {}

    def stream(name: str) -> str:
        if name not in stream_names:
            stream_names[name] = names.new(_stream_word(name))
        return stream_names[name]

    host = finding.get("space") == "host"
    access = (first["access"], second["access"])
    shape = {("write", "read"): "write then read", ("read", "write"): "read then write",
             ("write", "write"): "write then write"}.get(access)
    if shape is None:
        raise TraceError(f"two reads do not race ({first.get('step')}, {second.get('step')})")
    owner = names.new(_memory_word(finding.get("first_owner") or finding.get("owner")))
    reused = bool(finding.get("reused"))
    next_owner = names.new(_memory_word(finding.get("owner")) + "-next") if reused else owner
    steps: list[tuple[dict[str, Any], str]] = []  # (step, comment)
    first_id = names.new(_op_word(first))
    second_id = names.new(_op_word(second))
    sa = stream(str(first["stream"]))
    fix_event = names.new("fixed-order")

    def expect(byte: int, what: str) -> str:
        buf = names.new(f"{what}-expected")
        steps.append(({"op": "host_fill", "buffer": buf, "byte": f"0x{byte:02X}"}, ""))
        return buf

    def host_pair(first_step: dict[str, Any], fix: str, second_step: dict[str, Any]) -> None:
        """A stream's copy of pinned memory and the host's access, the fix a synchronize of
        the copy's stream between them."""
        window = _window(ops, first, second, {str(first["stream"])})
        edges = _edges(window, stream, names)
        steps.extend((s, c) for s, c, seq in edges if seq < int(first["seq"]))
        steps.append(({"id": first_id, **first_step, "stream": sa}, _said(a)))
        steps.extend((s, c) for s, c, seq in edges if seq > int(first["seq"]))
        steps.append(({"op": "synchronize", "stream": sa, "only": "fixed"}, "the fix: " + fix))
        steps.append(({"id": second_id, **second_step}, _said(b)))

    alloc_stream = _alloc_stream(ops, finding, int(first["seq"]))
    if host and shape == "write then read":  # the device writes pinned memory, the host reads
        source = names.new(f"{owner}-source")
        steps.append(({"id": source, "op": "materialize", "pages": 1}, ""))
        steps.append(({"op": "kernel", "stream": sa, "writes": source, "byte": f"0x{OLD:02X}"},
                      "what the copy will bring back"))
        steps.append(({"op": "synchronize"}, ""))
        want = expect(OLD, owner)
        host_pair({"op": "copy_to_host", "src": source, "dst": owner},
                  "the host waits for the copy",
                  {"op": "check", "buffer": owner, "equals": want})
    elif host and shape == "read then write":  # a copy reads pinned memory, the host rewrites
        steps.append(({"op": "host_fill", "buffer": owner, "byte": f"0x{FIRST:02X}"},
                      "what the copy should read"))
        want = expect(FIRST, owner)
        target = names.new(f"{owner}-device")
        steps.append(({"id": target, "op": "materialize", "pages": 1}, ""))
        host_pair({"op": "copy_from_host", "src": owner, "dst": target},
                  "the copy is done before the host rewrites the buffer",
                  {"op": "host_fill", "buffer": owner, "byte": f"0x{SECOND:02X}"})
        steps.append(({"op": "synchronize"}, ""))
        steps.append(({"id": "what-the-copy-read", "op": "check", "lease": target,
                       "equals": want}, ""))
    elif host:
        raise TraceError(f"a {shape} race on pinned memory between two streams "
                         f"({first.get('step')}, {second.get('step')}) cannot be written yet")
    else:
        sb = stream(str(second["stream"]))
        mat: dict[str, Any] = {"id": owner, "op": "materialize", "pages": 1}
        if alloc_stream is not None and reused:
            mat["stream"] = stream(alloc_stream)
        steps.append((mat, _memory_said(finding.get("first_owner") or finding.get("owner"))))
        steps.append(({"op": "kernel", "stream": sa, "writes": owner, "byte": f"0x{OLD:02X}"},
                      "what the bytes hold before the pair"))
        steps.append(({"op": "synchronize"}, ""))
        window = _window(ops, first, second, {str(first["stream"]), str(second["stream"])})
        edges = _edges(window, stream, names)
        before = [e for e in edges if e[2] < int(first["seq"])]
        between = [e for e in edges if e[2] > int(first["seq"])]
        steps += [(s, c) for s, c, _ in before]
        seen = names.new(f"{owner}-seen")
        if first["access"] == "write":
            steps.append(({"id": first_id, "op": "kernel", "stream": sa, "writes": owner,
                           "byte": f"0x{FIRST:02X}"}, _said(a)))
        else:
            steps.append(({"id": first_id, "op": "copy_to_host", "src": owner, "dst": seen,
                           "stream": sa}, _said(a) + " (a read: what it saw is checked)"))
        steps.append(({"op": "record_event", "event": fix_event, "stream": sa,
                       "only": "fixed"}, "the fix: an event after the first op"))
        steps += [(s, c) for s, c, _ in between]
        if reused:
            free = _free_of(ops, finding, int(first["seq"]), int(second["seq"]))
            steps.append(({"id": names.new("freed"), "op": "release", "lease": owner},
                          f"given back at {free}" if free else "given back"))
            mat2: dict[str, Any] = {"id": next_owner, "op": "materialize", "pages": 1}
            next_stream = _alloc_stream(ops, finding, int(second["seq"]))
            if next_stream is not None:
                mat2["stream"] = stream(next_stream)
            steps.append((mat2, _memory_said(finding.get("owner")) +
                          " (the caching allocator hands the bytes out again)"))
        steps.append(({"op": "wait_event", "event": fix_event, "stream": sb, "only": "fixed"},
                      "and the second op's stream waits for it"))
        if shape == "write then read":
            steps.append(({"id": second_id, "op": "copy_to_host", "src": next_owner,
                           "dst": seen, "stream": sb},
                          _said(b) + " (a read: what it saw is checked)"))
            steps.append(({"op": "synchronize"}, ""))
            want = expect(FIRST, owner)
            steps.append(({"id": "what-the-read-saw", "op": "check", "buffer": seen,
                           "equals": want}, ""))
        else:
            steps.append(({"id": second_id, "op": "kernel", "stream": sb, "writes": next_owner,
                           "byte": f"0x{SECOND:02X}"}, _said(b)))
            steps.append(({"op": "synchronize"}, ""))
            if shape == "read then write":
                want = expect(OLD, owner)
                steps.append(({"id": "what-the-read-saw", "op": "check", "buffer": seen,
                               "equals": want}, ""))
            else:
                want = expect(SECOND, owner)
                steps.append(({"id": "what-the-bytes-hold", "op": "check", "lease": next_owner,
                               "equals": want}, "the second write is the last"))
    kinds = {}
    for name, word in stream_names.items():
        info = streams.get(name, {})
        kinds[word] = "legacy" if info.get("legacy") else (
            "blocking" if info.get("blocking") else "non-blocking")
    scenario_name = names.new(f"{program}-{_line(first)}-{_line(second)}")
    pool: dict[str, Any] = {"pages": 4, "page_tokens": 64,
                            "planes": [{"dtype": "i8", "leading": 8, "heads": 2, "align": 256}]}
    if reused:
        pool["allocator"] = "caching"
    spec = {
        "pool": pool, "streams": kinds, "trials": 50,
        "variants": {"buggy": {"expect": "reproduces", "min_rate": 0.9},
                     "fixed": {"expect": "clean"}},
        "amplify": {"delay_us": delay_us, "stream": sa, "before": first_id},
    }
    doc = {"apiVersion": "gpurace/v1", "kind": "Scenario",
           "metadata": {"name": scenario_name,
                        "description": _description(finding, program)[:200],
                        "tags": ["watched", "reproducer"]}}
    text = _render(doc, spec, steps, finding, command)
    return Reproducer(text, scenario_name, len(steps), finding, shape)


def _render(doc: dict[str, Any], spec: dict[str, Any], steps: list[tuple[dict[str, Any], str]],
            finding: dict[str, Any], command: str) -> str:
    head = ["# Written by `gpurace minimize` from a watched run"
            + (f" of `{command}`" if command else "") + ".",
            "#", *_wrapped("# The race: " + str(finding.get("missing") or "")), "#",
            "# buggy runs the program's order; fixed adds the fix the finding suggests. Each step",
            "# stands for the program's op at the line its comment names.", ""]
    body = yaml.safe_dump(doc, sort_keys=False, width=100).rstrip().splitlines()
    body.append("spec:")
    for key, value in spec.items():
        body.append(f"  {key}: " + _flow(value))
    body.append("  steps:")
    for step, comment in steps:
        body.append("    - " + _flow(step) + (f"  # {comment}" if comment else ""))
    return "\n".join(head + body) + "\n"


def _flow(value: Any) -> str:
    if not isinstance(value, (dict, list)):  # a scalar: dumped alone it ends the document
        return _flow({"v": value})[len("{v: "):-1]
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    # Bytes are written 0x5A, as a scenario author writes them (YAML reads them back as ints).
    return re.sub(r"'(0x[0-9A-F]{2})'", r"\1", text)


def _wrapped(text: str, width: int = 96) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if len(line) + len(word) + 1 > width and line:
            lines.append(line)
            line = "#  "
        line = f"{line} {word}" if line else word
    return lines + ([line] if line else [])


def _window(ops: dict[int, dict[str, Any]], first: dict[str, Any], second: dict[str, Any],
            streams: set[str]) -> list[dict[str, Any]]:
    """The ops from the host's last synchronize before ``first`` to ``second``."""
    lo, hi = int(first["seq"]), int(second["seq"])
    start = 0
    for seq in range(lo - 1, 0, -1):
        op = ops.get(seq)
        if op is not None and op.get("kind") in ("sync_device", "sync_stream") and (
                op["kind"] == "sync_device" or op.get("syncs") in streams):
            start = seq
            break
    return [ops[s] for s in range(start + 1, hi) if s in ops and s != lo]


def _edges(window: list[dict[str, Any]], stream: Any, names: _Names,
           ) -> list[tuple[dict[str, Any], str, int]]:
    """The window's event records and waits on the pair's streams (a record only when a wait
    or a host synchronize in the window uses it), as steps, each with its seq."""
    records = {op.get("records"): op for op in window if op.get("kind") == "event_record"}
    used = {op.get("waits") for op in window if op.get("kind") in ("event_wait", "sync_event")}
    events: dict[str, str] = {}
    out = []
    for op in window:
        kind = op.get("kind")
        if kind not in _EDGES:
            continue
        event = op.get("records") if kind == "event_record" else op.get("waits")
        if event not in used or event not in records:
            continue
        if event not in events:
            events[event] = names.new("event-" + _event_word(str(event)))
        if kind == "event_record":
            step = {"op": "record_event", "event": events[event], "stream": stream(op["stream"])}
        elif kind == "event_wait":
            step = {"op": "wait_event", "event": events[event], "stream": stream(op["stream"])}
        else:
            step = {"op": "synchronize", "event": events[event]}
        out.append((step, f"{kind} at {op.get('step')}", int(op["seq"])))
    return out


def _alloc_stream(ops: dict[int, dict[str, Any]], finding: dict[str, Any],
                  seq: int) -> str | None:
    """The stream the caching allocator handed out the bytes of the op at ``seq`` on."""
    lo, hi = (finding["first"] if int(finding["first"]["seq"]) == seq
              else finding["second"])["bytes"]
    for s in range(seq - 1, 0, -1):
        op = ops.get(s)
        if op is not None and op.get("kind") == "alloc":
            _, start, n = op["detail"]["range"]
            if start <= lo and hi <= start + n:
                return op["detail"].get("stream")
    return None


def _free_of(ops: dict[int, dict[str, Any]], finding: dict[str, Any], lo: int,
             hi: int) -> str | None:
    first = min((finding["first"], finding["second"]), key=lambda o: int(o["seq"]))
    start, end = first["bytes"]
    for s in range(lo + 1, hi):
        op = ops.get(s)
        if op is not None and op.get("kind") == "free":
            _, at, n = op["detail"]["range"]
            if at <= start and end <= at + n:
                return op.get("step")
    return None


def _stream_word(name: str) -> str:
    if name == "the legacy default stream":
        return "legacy"
    match = re.match(r"stream made at .*:(\d+)$", name)
    return f"stream-{match[1]}" if match else name


def _memory_word(owner: str | None) -> str:
    """``tensor kv_cache float32[..] made at x.py:48`` -> ``kv_cache``; unnamed -> tensor-48."""
    text = owner or "memory"
    match = re.match(r"(tensor|array|pinned buffer)\s+([A-Za-z_][A-Za-z0-9_]*)\s+\S*\[", text)
    if match:
        return match[2]
    line = re.search(r":(\d+)\s*$", text)
    kind = text.split()[0] if text.split() else "memory"
    return f"{kind}-{line[1]}" if line else kind


def _memory_said(owner: str | None) -> str:
    return str(owner or "the racing bytes")


def _event_word(event: str) -> str:
    match = re.search(r":(\d+)(\s*#\d+)?$", event)
    return match[1] if match else event


def _op_word(op: dict[str, Any]) -> str:
    kind = str(op.get("kind", "op")).split(":")[-1].replace("_", "-").strip("-")
    return f"{kind or 'op'}-{_line(op)}"


def _line(op: dict[str, Any]) -> str:
    match = re.search(r":(\d+)$", str(op.get("step") or ""))
    return match[1] if match else "x"


def _said(op: dict[str, Any]) -> str:
    return f"{op.get('kind')} on {op.get('stream')} at {op.get('step')}"


def _description(finding: dict[str, Any], program: str) -> str:
    first, second = sorted((finding["first"], finding["second"]), key=lambda o: int(o["seq"]))
    return (f"{program}: {first['stream']}'s {first['access']} ({first['kind']} at line "
            f"{_line(first)}) and {second['stream']}'s {second['access']} ({second['kind']} at "
            f"line {_line(second)}), unordered")


@dataclass(frozen=True)
class Watched:
    """A watched run's trace, as `gpurace minimize` takes it."""

    records: tuple[dict[str, Any], ...]
    findings: tuple[dict[str, Any], ...]
    program: str
    command: str


def watched_source(source: Path, children: bool = True) -> Watched | None:
    """The watched run ``source`` names: a watched run's incident folder (or its report.json),
    its trace.jsonl, or the capture events a run wrote (``watch/run-001/events.jsonl``, or a
    child's ``children/child-PID.jsonl``); None when ``source`` is none of these (a scenario's
    incident or trace: minimize's own). Where the program's own process found no race, the
    first of its child processes' captures that did (kept in the incident folder, or in the
    run's ``children`` folder) stands for the run."""
    from harness.traces.optrace import is_op_trace

    folder = source if source.is_dir() else source.parent
    report_file = source / "report.json" if source.is_dir() else (
        source if source.name == "report.json" else None)
    command = ""
    if report_file is not None:
        if not report_file.exists():
            return None
        try:
            report = json.loads(read_input(report_file, REPORT_MAX_BYTES, "a report").decode())
        except (Unreadable, UnicodeDecodeError, ValueError, RecursionError):
            return None  # minimize's own reading of it says what is wrong
        variant = report.get("variant") if isinstance(report, dict) else None
        if not isinstance(variant, dict) or variant.get("name") != "watched":
            return None
        reproduce = report.get("reproduce")
        argv = reproduce.get("argv") if isinstance(reproduce, dict) else None
        command = " ".join(str(w) for w in argv) if isinstance(argv, list) else ""
        trace_path = folder / "trace.jsonl"
    elif isinstance(head := _first_line(source), list) and head[:1] == ["hello"]:
        from harness.capture.analysis import RunAnalysis
        from harness.capture.events import batches
        # The capture's op trace, made here and read below: removed once read.
        scratch = Path(tempfile.mkdtemp(prefix="gpurace-minimize-"))
        try:
            analysis = RunAnalysis(scratch / "trace.jsonl", {"scenario": _program_of(head),
                                                              "variant": "watched"})
            for events, _ in batches(source):
                analysis.feed(events)
            analysis.close()
            return _read_watched(scratch / "trace.jsonl", folder, command, children)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    elif is_op_trace(source) and isinstance(head, dict) and head.get("variant") == "watched":
        trace_path = source  # a scenario's trace is minimize's own: not loaded here
    else:
        return None
    return _read_watched(trace_path, folder, command, children)


def _read_watched(trace_path: Path, folder: Path, command: str, children: bool
                  ) -> Watched | None:
    """The watched run of the op trace at ``trace_path`` (``folder`` holds its children's
    captures), or None where the trace is not a watched run's."""
    from harness.races.detector import check_trace
    from harness.traces.optrace import load_trace, stream_trace

    if not trace_path.is_file() or trace_path.stat().st_size <= TRACE_MAX_BYTES:
        trace = load_trace(trace_path)
        header, records = trace.header, tuple(trace.records)
        findings = tuple(f.to_json() for f in check_trace(records).findings)
    else:  # a real program's run: read twice as a stream, its pairs' windows kept
        findings = tuple(f.to_json() for f in check_trace(stream_trace(trace_path)).findings)
        header = _first_line(trace_path)  # checked by the reading above
        records = _windows(trace_path, findings)
    if header.get("variant") != "watched":
        return None
    program = str(header.get("scenario") or "program")
    if not findings and children:
        for capture in [*sorted(folder.glob("child-*.jsonl")),
                        *sorted((folder / "children").glob("child-*.jsonl"))]:
            child = watched_source(capture, children=False)
            if child is not None and child.findings:
                return Watched(child.records, child.findings, child.program,
                               command or child.command)
    return Watched(records, findings, program, command)


WINDOW_OPS = 20_000
"""Ops kept before a racing pair's first op from a trace too large to hold: the scenario
keeps the edges since the host's last synchronize before the pair, most often a few ops back
(a step's wait); beyond this window it starts at the window's first op."""


def _windows(path: Path, findings: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The records of the trace at ``path`` that the scenarios of ``findings`` read: every
    declaration, each pair's window of ops (:data:`WINDOW_OPS` before its first op, to its
    second), and the allocations and frees of the bytes the pairs touch."""
    from harness.traces.optrace import stream_trace

    spans = [(int(f["first"]["seq"]), int(f["second"]["seq"])) for f in findings]
    windows = [(min(a, b) - WINDOW_OPS, max(a, b)) for a, b in spans]
    touched = [tuple(side["bytes"]) for f in findings for side in (f["first"], f["second"])]
    kept = []
    for record in stream_trace(path):
        if record.get("type") != "op":
            kept.append(record)
            continue
        seq = int(record["seq"])
        if any(lo <= seq <= hi for lo, hi in windows):
            kept.append(record)
        elif record.get("kind") in ("alloc", "free"):
            _, start, n = (record.get("detail") or {}).get("range", (0, 0, 0))
            if any(start < hi and lo < start + n for lo, hi in touched):
                kept.append(record)
    return tuple(kept)


def _first_line(path: Path) -> Any:
    """The JSON of a file's first line (a capture's hello, a trace's header), or None."""
    try:
        head = read_input(path, HEAD_BYTES, "a watched run's file", head=True)
        return json.loads(head.split(b"\n", 1)[0].decode("utf-8"))
    except (Unreadable, UnicodeDecodeError, ValueError, RecursionError):
        return None


def _program_of(hello_event: list[Any]) -> str:
    hello = hello_event[1] if len(hello_event) > 1 else None
    argv = hello.get("argv") or ["program"] if isinstance(hello, dict) else ["program"]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", Path(str(argv[0])).stem)[:64] or "program"
