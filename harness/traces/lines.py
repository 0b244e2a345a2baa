"""The op trace's lines, as text: the one writer of the format :mod:`harness.traces.optrace`
reads. The flight recorder writes a trial's trace with it, and a watched run's analysis its
``trace.jsonl``, so the two cannot drift apart.

Each function gives one line without its newline. Keys come in a fixed order (an op line's
is :meth:`OpRecord.to_json`'s, then ``type``), so a line is the same bytes every time.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from harness.traces.optrace import TRACE_SCHEMA
from kvcore.device.oplog import Access, BufferInfo, Label, OpRecord, Segment, StreamInfo

# Compact JSON. An op's detail may hold a value JSON has no type for: it is written as text.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode

# The same buffers, streams and owners begin every trial's trace of a worker, and encoding
# them again was most of the recorder's cost in a reissued trial: their records are frozen,
# so each line is kept by its record. Bounded, for a run that makes buffers without end.
_remembered = functools.lru_cache(maxsize=4096)


def header_line(header: dict[str, Any], **numbers: int) -> str:
    """The first line: ``header``'s keys, then ``numbers`` (a trial's own: index, seed, pid)."""
    return with_numbers(_encode({"type": "header", "schema": TRACE_SCHEMA, "level": "ops",
                                 **header}), **numbers)


def with_numbers(line: str, **numbers: int) -> str:
    """``line`` with ``numbers`` (integers) as its last fields, as the encoder writes them: a
    worker's trials share their header but for these, and the rest is encoded once."""
    return line[:-1] + "".join([f',"{key}":{value:d}' for key, value in numbers.items()]) + "}"


@_remembered
def buffer_line(info: BufferInfo, page_bytes: int) -> str:
    """A buffer the ops name; ``page_bytes``: its page stride, 0 when it has no pages."""
    return _encode({"type": "buffer", "id": info.id, "name": info.name, "space": info.space,
                    "nbytes": info.nbytes, "role": info.role, "page_bytes": page_bytes})


@_remembered
def stream_line(info: StreamInfo) -> str:
    return _encode({"type": "stream", "name": info.name, "blocking": info.blocking,
                    "legacy": info.legacy, "priority": info.priority})


@_remembered
def label_line(label: Label) -> str:
    """Bytes that had an owner when the trial began."""
    return _encode({"type": "label", "buffer": label.buffer, "offset": label.offset,
                    "length": label.length, "name": label.name})


def op_line(record: OpRecord) -> str:
    """What ``json.dumps(record.to_json() | {"type": "op"})`` writes, compactly. The part
    from the stream to the step, and the detail, recur trial after trial and are encoded
    once; the general encoder on every op was most of a stepped trial's recording."""
    times = ""
    if record.t_issue_ns is not None:
        times = f',"t_issue_ns":{record.t_issue_ns:d}'
    if record.t_start_ns is not None:  # the simulated device's (or a timeline's) times
        times += f',"t_start_ns":{record.t_start_ns:d}'
    if record.t_end_ns is not None:
        times += f',"t_end_ns":{record.t_end_ns:d}'
    detail = f',"detail":{_detail(record.detail)}' if record.detail else ""
    middle = _middle(record.stream, record.kind, record.reads, record.writes, record.records,
                     record.waits, record.syncs, record.step)
    return f'{{"seq":{record.seq:d}{middle}{times}{detail},"type":"op"}}'


_DETAILS: dict[tuple[Any, ...] | str, str] = {}  # by items, or a lone origin
_DETAILS_MAX = 65536


def _detail(detail: dict[str, object]) -> str:
    """An op's detail as JSON, found again by its items where it was seen before (a fill's
    byte and line, a lease's name and range). Each value is keyed with its type, since True
    is 1 to a dict and not to JSON; a list of ints as a tuple. Any other list, or a value
    that cannot be a key, is encoded every time. Most ops' detail is only the scenario line
    that issued them, found by that line alone."""
    if len(detail) == 1:
        origin = detail.get("origin")
        if origin.__class__ is str:
            text = _DETAILS.get(origin)
            if text is None:
                text = _encode(detail)
                if len(_DETAILS) < _DETAILS_MAX:
                    _DETAILS[origin] = text
            return text
    items = []
    for key, value in detail.items():
        kind = value.__class__
        if kind is list or kind is tuple:
            if not all(x.__class__ is int for x in value):  # type: ignore[attr-defined]
                return _encode(detail)
            value = tuple(value)  # type: ignore[arg-type]
        items.append((key, kind, value))
    found = tuple(items)
    try:
        text = _DETAILS.get(found)
    except TypeError:  # a dict among the values
        return _encode(detail)
    if text is None:
        text = _encode(detail)
        if len(_DETAILS) < _DETAILS_MAX:
            _DETAILS[found] = text
    return text


@functools.lru_cache(maxsize=65536)
def _middle(stream: str, kind: str, reads: tuple[Access, ...], writes: tuple[Access, ...],
            records: str | None, waits: str | None, syncs: str | None,
            step: str | None) -> str:
    """An op line's fields from the stream to the step, with their leading comma."""
    text = _encode(OpRecord(0, stream, kind, reads, writes, records, waits, syncs,
                            step).to_json())
    return "," + text[text.index('"stream"'):-1]


def program_line(number: int, templates: tuple[tuple[Any, ...], ...]) -> str:
    """A piece of a reissued program: each op as its op line has it, without its seq and
    times, and which ops take a live value (their detail's ``value``, from the run)."""
    ops = []
    live = []
    for k, template in enumerate(templates):
        # kvcore's record template, in its order (see kvcore.device.base).
        stream, kind, reads, writes, records, waits, syncs, step, detail, _, value = template
        op = OpRecord(0, stream, kind, reads, writes, records, waits, syncs, step,
                      detail=detail).to_json()
        del op["seq"]
        ops.append(op)
        if value is not None:
            live.append(k)
    record: dict[str, Any] = {"type": "program", "id": number, "ops": ops}
    if live:
        record["live"] = live
    return _encode(record)


def run_line(number: int, segment: Segment) -> str:
    """Program ``number``'s piece issued again: its first seq, its one issue time, the bytes
    its live memsets set. Written by hand, as the encoder would: one goes out per piece of
    every reissued trial."""
    line = f'{{"type":"run","program":{number:d},"seq":{segment.first_seq:d}'
    if segment.t_issue_ns is not None:
        line += f',"t_issue_ns":{segment.t_issue_ns:d}'
    if segment.values:  # ints: the bytes of live memsets
        line += ',"values":[' + ",".join([f"{value:d}" for value in segment.values]) + "]"
    return line + "}"


def times_line(times: list[tuple[int, int, int]]) -> str:
    """Device times of ops above, as ``[seq, t_start_ns, t_end_ns]``."""
    return _encode({"type": "times", "ops": times})
