"""Op traces: what a worker did, one device-visible action a line (the flight recorder's files).

An op trace is versioned JSON Lines. Line 1 is the header; then "buffer" and "stream" records
declare what the ops name, each before the first op that uses it; then one "op" record per
action, in the order the host issued them::

    {"type":"header","schema":"gpurace.trace/1","level":"ops","scenario":"release-fence",...}
    {"type":"buffer","id":3,"name":"kv-arena","space":"device","nbytes":262144,...}
    {"type":"stream","name":"stream","blocking":false,"legacy":false}
    {"seq":8,"stream":"stream","kind":"copy_htod","reads":[[6,0,4096]],"writes":[[3,0,4096]],
     "step":"write-new","type":"op"}

A trial the device reissued from a captured program is written compactly: a "program" record
holds a piece of the program once (its ops as op records have them, without seq and times;
``live``: the ops whose detail takes a ``value``), and each "run" record stands for that
piece's ops issued again, numbered from its ``seq``, the last carrying the run's one
``t_issue_ns``, the ``values`` (bytes set by live memsets) in order::

    {"type":"program","id":0,"ops":[{"stream":"transfer","kind":"copy_htod",...},...]}
    {"type":"run","program":0,"seq":41,"t_issue_ns":1894022,"values":[171]}

:func:`load_trace` expands each run into its op records, checked as any op is, and
:func:`plain` writes a trace with its runs expanded, as op lines only.

:func:`load_trace` reads one and checks every record: a trace is evidence another engineer
replays, so one it cannot vouch for is refused, at its line and field, rather than half-read.
Every size and count is bounded (:mod:`harness.limits`): the race detector's work over a trace
grows with the trace, never with the sizes it declares. A ``path`` in the header is data: only
`gpurace minimize` follows it, through the same bounded reader as any input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import limits as L
from harness.inputs import Unreadable, clip, echo, read_input
from harness.inputs import plain as one_line  # this module's plain() expands a trace's runs
from harness.traces.jsonl import LineParser, line_error, read_text, show
from kvcore.device.oplog import HOST, HOST_KINDS, is_stream_kind

TRACE_SCHEMA = "gpurace.trace/1"
"""The schema version this gpurace writes and reads."""
_SCHEMA_FAMILY = "gpurace.trace/"

# The header says where the trial came from: enough for `gpurace minimize` to run it again.
_HEADER_KEYS = ("type", "schema", "level", "scenario", "path", "variant", "backend", "defects",
                "run_seed", "delay_us", "amplify", "poison", "trial", "seed", "pid", "part")
_BUFFER_KEYS = ("type", "id", "name", "space", "nbytes", "role", "page_bytes")
_STREAM_KEYS = ("type", "name", "blocking", "legacy", "priority")
_LABEL_KEYS = ("type", "buffer", "offset", "length", "name")
_OP_KEYS = ("type", "seq", "stream", "kind", "reads", "writes", "records", "waits", "syncs",
            "step", "t_issue_ns", "t_start_ns", "t_end_ns", "detail")
_PROGRAM_KEYS = ("type", "id", "ops", "live")
_PROGRAM_OP_KEYS = tuple(k for k in _OP_KEYS if k not in ("type", "seq", "t_issue_ns",
                                                          "t_start_ns", "t_end_ns"))
_RUN_KEYS = ("type", "program", "seq", "t_issue_ns", "values")
_SPACES = ("device", "host")


@dataclass(frozen=True)
class OpTrace:
    """A checked op trace: its header, and every record (header first) in file order, as the
    race detector's :func:`~harness.races.detector.check_trace` takes them."""

    path: Path
    header: dict[str, Any]
    records: tuple[dict[str, Any], ...]

    @property
    def ops(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == "op"]


def load_trace(path: Path | str) -> OpTrace:
    """Read and check the op trace at ``path``.

    Raises :class:`~harness.errors.TraceError` for the first problem, as ``path:line: field:
    what is wrong and what to do``.
    """
    path = Path(path)
    return _Parser(path).finish(read_text(path, "an op trace", L.TRACE_MAX_BYTES,
                                          "record a shorter trial (fewer steps or requests)"))


def stream_trace(path: Path | str) -> Iterator[dict[str, Any]]:
    """Each record of the op trace at ``path``, checked as :func:`load_trace` checks it, read
    a line at a time and handed on, not kept: a trace of any size, such as a real program's
    watched run (tens of megabytes), in the memory of one record. Its ops are still at most
    :data:`~harness.limits.TRACE_MAX_OPS`, and a trace with ``times`` records is read whole.
    The first record is the header. Raises :class:`TraceError` at the first record it cannot
    vouch for (the records before it were handed on)."""
    path = Path(path)
    parser = _Parser(path, whole=False)
    try:
        with open(path, encoding="utf-8", newline="\n") as file:
            for record in parser.read_lines(file):
                yield from parser.record(record)
    except UnicodeDecodeError as exc:
        raise line_error(path, parser.line + 1, 1, "(record)",
                         f"not UTF-8 text (byte {exc.object[exc.start]:#04x}); an op trace is "
                         "UTF-8 JSON Lines") from None
    except OSError as exc:
        raise line_error(path, 1, 1, "(file)", f"cannot be read ({exc.strerror or exc})") \
            from None
    parser.not_empty()


def is_op_trace(path: Path) -> bool:
    """Whether ``path`` starts like an op trace (a header naming an op trace schema, of any
    version, so that load_trace can say which it does not read); the full check is load_trace's.
    Only the head of a regular file is read."""
    try:
        head = read_input(path, L.HEAD_BYTES, "an op trace", head=True)
        first = json.loads(head.split(b"\n", 1)[0].decode("utf-8"))
    except (Unreadable, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(first, dict) and str(first.get("schema", "")).startswith(_SCHEMA_FAMILY)


def run_ops(program: dict[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """The op records a "run" record stands for, keys in an op line's order: the program's
    ops numbered from the run's seq, the last with the run's issue time, each live op's detail
    with its byte from the run's values."""
    ops, live = program["ops"], program.get("live", ())
    values = dict(zip(live, run.get("values", ())))
    issued = run.get("t_issue_ns")
    last = len(ops) - 1
    out = []
    for i, op in enumerate(ops):
        record: dict[str, Any] = {"seq": run["seq"] + i}
        record.update((k, v) for k, v in op.items() if k != "detail")
        if i == last and issued is not None:
            record["t_issue_ns"] = issued
        detail = op.get("detail")
        if i in values:
            detail = {**(detail or {}), "value": values[i]}
        if detail:
            record["detail"] = detail
        record["type"] = "op"
        out.append(record)
    return out


def plain(text: str) -> str:
    """An op trace's text with its runs expanded into op lines and its program records left
    out; a trace without runs comes back as it is. Lines it cannot read stay as they are (the
    trace's reader says what is wrong with them)."""
    if '"type":"run"' not in text:
        return text
    programs: dict[Any, dict[str, Any]] = {}
    lines = []
    for line in text.splitlines(keepends=True):
        if '"type":"program"' in line or '"type":"run"' in line:
            try:
                record = json.loads(line)
                if record.get("type") == "program":
                    programs[record["id"]] = record
                    continue
                if record.get("type") == "run":
                    lines.extend(json.dumps(op, separators=(",", ":")) + "\n"
                                 for op in run_ops(programs[record["program"]], record))
                    continue
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
        lines.append(line)
    return "".join(lines)


def plain_file(path: Path) -> Path | list[str]:
    """The trace at ``path`` as an incident keeps it: the file itself when it holds no runs,
    else its lines with the runs expanded (:func:`plain`)."""
    with open(path, encoding="utf-8", errors="replace") as file:
        text = file.read(L.TRACE_MAX_BYTES + 1)
    expanded = plain(text)
    return path if expanded is text else expanded.splitlines(keepends=True)


class _Parser(LineParser):
    reads = "an op trace"
    remedy = "the trace was cut or edited; record it again (`gpurace run --record`)"

    def __init__(self, path: Path, whole: bool = True) -> None:
        super().__init__(path)
        self.whole = whole  # False: records are handed on as read, none kept (a stream)
        self.count = 0  # records read
        self.kept: list[dict[str, Any]] = []
        self.buffers: dict[int, tuple[int, int]] = {}  # id -> (nbytes, line declared)
        self.streams: dict[str, int] = {}  # name -> line declared
        self.seq = 0
        self.seq_line = 0
        self.by_seq: dict[int, dict[str, Any]] = {}  # the ops above, for a times record
        self.programs: dict[int, tuple[dict[str, Any], int]] = {}  # id -> (record, line)
        self.ops = 0

    def finish(self, text: str) -> OpTrace:
        for record in self.records(text):
            self.kept.extend(self.record(record))
        self.not_empty()
        return OpTrace(self.path, self.kept[0], tuple(self.kept))

    def not_empty(self) -> None:
        if not self.count:
            self.line = 1
            raise self.fail("(file)", "empty file; an op trace starts with a header line "
                                      f'{{"type": "header", "schema": "{TRACE_SCHEMA}", ...}}')

    def record(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """Check one record; the records it stands for (a run's ops, none for a program)."""
        kind = record.get("type")
        self.count += 1
        if self.count == 1:
            self.header(record)
        elif kind == "op":
            self.op(record)
        elif kind == "buffer":
            self.buffer(record)
        elif kind == "stream":
            self.stream(record)
        elif kind == "label":
            self.label(record)
        elif kind == "times":
            if not self.whole:
                raise self.fail("type", "a times record sets the times of the ops above it: "
                                        "a trace with one is read whole, so it must be at "
                                        f"most {L.TRACE_MAX_BYTES >> 20} MiB")
            self.times(record)
        elif kind == "program":
            self.program(record)
            return []  # its ops are kept where a run issues them
        elif kind == "run":
            return list(map(self.op, run_ops(self.run(record), record)))
        elif kind == "header":
            raise self.fail("type", "a second header (the first is on line 1); an op trace "
                                    "holds one trial: split concatenated traces into files")
        elif "type" not in record:
            raise self.fail("type", 'missing; every record needs "type": "header", "buffer", '
                                    '"stream", "label", "op", "times", "program" or "run"')
        else:
            raise self.fail("type", f"unknown record type {show(kind)}; an op trace has "
                                    "header, buffer, stream, label, op, times, program and "
                                    "run records")
        return [record]

    def header(self, record: dict[str, Any]) -> None:
        schema = record.get("schema")
        if record.get("type") != "header" or not isinstance(schema, str):
            raise self.fail("type", f"the first record must be the header "
                                    f'({{"type": "header", "schema": "{TRACE_SCHEMA}", ...}}); '
                                    "this is not a gpurace op trace")
        # The schema before anything else: another version may have other keys, and "this
        # version is not supported" is the useful thing to say about it.
        if schema != TRACE_SCHEMA:
            if schema.startswith(_SCHEMA_FAMILY):
                raise self.fail("schema", f"{clip(one_line(schema))} is not supported; this "
                                          f"gpurace reads {TRACE_SCHEMA}: record the trace "
                                          "again with it")
            if schema.startswith("gpurace.ticket/"):
                raise self.fail("schema", f"{clip(one_line(schema))} is a request-level ticket, "
                                          "not an op trace; replay it with `gpurace replay`")
            raise self.fail("schema", f"{echo(schema)} is not an op trace schema; this gpurace "
                                      f"reads {TRACE_SCHEMA}")
        self.check_keys(record, _HEADER_KEYS, ("type", "schema"), "header")
        if record.get("level", "ops") != "ops":
            raise self.fail("level", f'must be "ops", not {show(record["level"])}')
        for key in ("scenario", "path", "variant", "backend"):
            self.optional_string(record, key)
        for key in ("trial", "seed", "pid", "part"):
            if key in record:
                self.integer(record, key, minimum=0, maximum=L.SEED_MAX)
        if "run_seed" in record:
            self.integer(record, "run_seed", minimum=-L.SEED_MAX, maximum=L.SEED_MAX)
        delay = record.get("delay_us")
        if delay is not None and (not isinstance(delay, (int, float)) or isinstance(delay, bool)
                                  or not 0 <= delay <= L.DELAY_MAX_US or not math.isfinite(delay)):
            raise self.fail("delay_us", f"must be null or microseconds from 0 to "
                                        f"{L.DELAY_MAX_US:,.0f} (10 s), not {show(delay)}")
        defects = record.get("defects", {})
        if not isinstance(defects, dict) or not all(isinstance(v, bool)
                                                    for v in defects.values()):
            raise self.fail("defects", f"must be an object of kvcore defect names to true or "
                                       f"false, not {show(defects)}")
        if not isinstance(record.get("poison", False), bool):
            raise self.fail("poison", f"must be true or false, not {show(record['poison'])}")
        amplify = record.get("amplify")
        if amplify is not None and not (
                isinstance(amplify, dict) and set(amplify) == {"stream", "before"}
                and all(v is None or isinstance(v, str) for v in amplify.values())):
            raise self.fail("amplify", f'must be null or {{"stream": ..., "before": ...}} (each '
                                       f"a string or null), not {show(amplify)}")

    def buffer(self, record: dict[str, Any]) -> None:
        self.check_keys(record, _BUFFER_KEYS, ("type", "id", "name", "space", "nbytes"),
                        "buffer record")
        buffer_id = self.integer(record, "id", minimum=0)
        if buffer_id in self.buffers:
            raise self.fail("id", f"buffer {buffer_id} is already declared on line "
                                  f"{self.buffers[buffer_id][1]}; each buffer once")
        if len(self.buffers) >= L.TRACE_MAX_BUFFERS:
            raise self.fail("id", f"more than {L.TRACE_MAX_BUFFERS:,} buffers, the most an op "
                                  "trace may declare; record a shorter trial")
        self.string(record, "name")
        space = self.string(record, "space")
        if space not in _SPACES:
            raise self.fail("space", f'must be "device" or "host", not {echo(space)}')
        nbytes = self.integer(record, "nbytes", minimum=1, maximum=L.TRACE_MAX_BUFFER_BYTES,
                              what="bytes of a buffer (256 GiB)")
        self.optional_string(record, "role")
        if "page_bytes" in record:
            self.integer(record, "page_bytes", minimum=0, maximum=L.TRACE_MAX_BUFFER_BYTES,
                         what="bytes of a buffer (256 GiB)")
        self.buffers[buffer_id] = (nbytes, self.line)

    def stream(self, record: dict[str, Any]) -> None:
        self.check_keys(record, _STREAM_KEYS, _STREAM_KEYS[:4], "stream record")
        if "priority" in record:
            self.integer(record, "priority", minimum=-(1 << 31), maximum=(1 << 31) - 1)
        name = self.string(record, "name")
        if name == HOST or not name:
            raise self.fail("name", f"{echo(name)} cannot name a stream ({HOST!r} is the host's "
                                    "own actions)")
        if name in self.streams:
            raise self.fail("name", f"stream {echo(name)} is already declared on line "
                                    f"{self.streams[name]}; each stream once")
        if len(self.streams) >= L.TRACE_MAX_STREAMS:
            raise self.fail("name", f"more than {L.TRACE_MAX_STREAMS} streams, the most an op "
                                    "trace may declare; record a trial with fewer streams")
        self.boolean(record, "blocking")
        self.boolean(record, "legacy")
        self.streams[name] = self.line

    def label(self, record: dict[str, Any]) -> None:
        """Bytes that had an owner (a lease, a pinned buffer) when the trial began."""
        self.check_keys(record, _LABEL_KEYS, _LABEL_KEYS, "label record")
        self.string(record, "name")
        self.span("offset", [record["buffer"], record["offset"], record["length"]])

    def times(self, record: dict[str, Any]) -> None:
        """Device times of ops above, measured once the trial ended (``--timeline``): each op
        named gets them as its ``t_start_ns`` and ``t_end_ns``."""
        self.check_keys(record, ("type", "ops"), ("type", "ops"), "times record")
        ops = record["ops"]
        if not isinstance(ops, list) or len(ops) > len(self.by_seq):
            raise self.fail("ops", f"must be an array of [seq, t_start_ns, t_end_ns], one per "
                                   f"op above at most, not {show(ops)}")
        for i, item in enumerate(ops):
            if not (isinstance(item, list) and len(item) == 3 and all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in item)):
                raise self.fail(f"ops[{i}]", f"must be [seq, t_start_ns, t_end_ns], integers "
                                             f"of at least 0, not {show(item)}")
            seq, start, end = item
            if seq not in self.by_seq:
                raise self.fail(f"ops[{i}]", f"op {seq} is not above; a times record follows "
                                             "the ops it times")
            if end < start:
                raise self.fail(f"ops[{i}]", f"op {seq} ends ({end}) before it starts ({start})")
            self.by_seq[seq]["t_start_ns"], self.by_seq[seq]["t_end_ns"] = start, end

    def program(self, record: dict[str, Any]) -> None:
        """A piece of a reissued program: its ops are checked where a run issues them."""
        self.check_keys(record, _PROGRAM_KEYS, ("type", "id", "ops"), "program record")
        number = self.integer(record, "id", minimum=0)
        if number in self.programs:
            raise self.fail("id", f"program {number} is already declared on line "
                                  f"{self.programs[number][1]}; each program once")
        ops = record["ops"]
        if not (isinstance(ops, list) and 0 < len(ops) <= L.TRACE_MAX_PROGRAM_OPS):
            raise self.fail("ops", f"must be an array of 1 to {L.TRACE_MAX_PROGRAM_OPS:,} op "
                                   f"records without seq and times, not {show(ops)}")
        for i, op in enumerate(ops):
            if not isinstance(op, dict):
                raise self.fail(f"ops[{i}]", f"must be an op record, not {show(op)}")
            self.check_keys(op, _PROGRAM_OP_KEYS, ("stream", "kind"), "program's op",
                            prefix=f"ops[{i}].")
        live = record.get("live", [])
        if not (isinstance(live, list) and all(
                isinstance(k, int) and not isinstance(k, bool) for k in live)
                and live == sorted(set(live)) and all(0 <= k < len(ops) for k in live)):
            raise self.fail("live", f"must be the positions of ops in ops (ascending, each "
                                    f"once), not {show(live)}")
        self.programs[number] = (record, self.line)

    def run(self, record: dict[str, Any]) -> dict[str, Any]:
        """A program piece issued again: its program record (the run's ops are checked by
        the caller, each as an op record at this line)."""
        self.check_keys(record, _RUN_KEYS, ("type", "program", "seq"), "run record")
        number = self.integer(record, "program", minimum=0)
        if number not in self.programs:
            raise self.fail("program", f"program {number} is not declared above; a program "
                                       "record must come before its first run")
        self.integer(record, "seq", minimum=1)
        if "t_issue_ns" in record:
            self.integer(record, "t_issue_ns", minimum=0)
        program = self.programs[number][0]
        values, live = record.get("values", []), program.get("live", [])
        if not (isinstance(values, list) and len(values) == len(live) and all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255
                for v in values)):
            raise self.fail("values", f"must be {len(live)} byte(s), one for each live op of "
                                      f"program {number}, not {show(values)}")
        if self.ops + len(program["ops"]) > L.TRACE_MAX_OPS:
            raise self.fail("program", f"more than {L.TRACE_MAX_OPS:,} ops, the most an op "
                                       "trace may hold; record a shorter trial")
        return program

    def op(self, record: dict[str, Any]) -> dict[str, Any]:
        if self.ops >= L.TRACE_MAX_OPS:
            raise self.fail("seq", f"more than {L.TRACE_MAX_OPS:,} ops, the most an op trace "
                                   "may hold; record a shorter trial")
        self.ops += 1
        self.check_keys(record, _OP_KEYS, ("type", "seq", "stream", "kind"), "op record")
        seq = self.integer(record, "seq", minimum=1)
        if seq <= self.seq:
            raise self.fail("seq", f"{seq} does not follow seq {self.seq} on line "
                                   f"{self.seq_line}; ops are in issue order")
        self.seq, self.seq_line = seq, self.line
        if self.whole:
            self.by_seq[seq] = record
        stream = self.string(record, "stream")
        kind = self.string(record, "kind")
        if stream == HOST:
            if kind not in HOST_KINDS:
                raise self.fail("kind", f"unknown host op {echo(kind)}; the host's ops are "
                                        f"{', '.join(sorted(HOST_KINDS))}")
        else:
            if stream not in self.streams:
                raise self.fail("stream", f"{echo(stream)} is not declared above; a stream "
                                          "record must come before its first op")
            if not is_stream_kind(kind):
                raise self.fail("kind", f"unknown op {echo(kind)} on stream {echo(stream)}; a "
                                        "stream runs copies, memsets, kernels (kernel:NAME) and "
                                        "event records and waits")
        for key in ("reads", "writes"):
            if key in record:
                self.accesses(record, key)
        for key in ("records", "waits", "step"):
            self.optional_string(record, key)
        syncs = self.optional_string(record, "syncs")
        if syncs is not None and syncs not in self.streams:
            raise self.fail("syncs", f"{echo(syncs)} is not a stream declared above")
        for key in ("t_issue_ns", "t_start_ns", "t_end_ns"):
            if key in record:
                self.integer(record, key, minimum=0)
        detail = record.get("detail", {})
        if not isinstance(detail, dict):
            raise self.fail("detail", f"must be an object, not {show(record['detail'])}")
        for key in ("site", "origin"):  # where the op came from: findings print them
            if detail.get(key) is not None:
                self.string(detail, key, prefix="detail.")
        if kind in ("alloc", "free"):
            # The detector names bytes by these: a range it cannot place is refused here.
            self.span("detail.range", detail.get("range"))
        if kind == "alloc":
            if not isinstance(detail.get("name"), str):
                raise self.fail("detail.name", f"must be a string (who the bytes belong to), "
                                               f"not {show(detail.get('name'))}")
            self.string(detail, "name", prefix="detail.")
            if detail.get("stream") is not None:
                self.string(detail, "stream", prefix="detail.")
        return record

    def accesses(self, record: dict[str, Any], key: str) -> None:
        ranges = record[key]
        if not isinstance(ranges, list):
            raise self.fail(key, f"must be an array of [buffer, offset, length], not "
                                 f"{show(ranges)}")
        if len(ranges) > L.TRACE_MAX_ACCESSES:
            raise self.fail(key, f"{len(ranges):,} byte ranges, more than "
                                 f"{L.TRACE_MAX_ACCESSES:,}, the most one op may touch")
        for i, access in enumerate(ranges):
            self.span(f"{key}[{i}]", access)

    def span(self, where: str, access: Any) -> None:
        """``[buffer, offset, length]``: bytes of a buffer declared above, inside it."""
        if not (isinstance(access, list) and len(access) == 3 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in access)):
            raise self.fail(where, f"must be [buffer, offset, length] integers, not "
                                   f"{show(access)}")
        buffer_id, offset, length = access
        if buffer_id not in self.buffers:
            raise self.fail(where, f"buffer {buffer_id} is not declared above; a buffer "
                                   "record must come before its first use")
        nbytes = self.buffers[buffer_id][0]
        if offset < 0 or length < 0 or offset + length > nbytes:
            raise self.fail(where, f"bytes {offset}..{offset + length} are outside buffer "
                                   f"{buffer_id} (0..{nbytes})")


def issue_times(path: Path | str) -> dict[int, tuple[int, str | None]]:
    """The host's clock at each op's issue, and its step, by seq, from an op trace of any size
    (:func:`stream_trace`): a watched run's, for ``--amplify auto``'s delays. Raises
    :class:`TraceError` where the trace cannot be read."""
    return {int(r["seq"]): (int(r["t_issue_ns"]), r.get("step")) for r in stream_trace(path)
            if r.get("type") == "op" and isinstance(r.get("t_issue_ns"), int)}
