"""Pictures of a trial's ops: a Chrome trace that ui.perfetto.dev and chrome://tracing open, and
an SVG of the last ops that a browser shows with no script and no network.

Both read op records as the trace file and the incident report hold them (plain dicts: ``seq``,
``stream``, ``kind``, ``reads``/``writes`` as ``[buffer, offset, length]``, ``records``,
``waits``, ``syncs``, ``step``, the times; ``detail.thread``, the scenario's host thread that
issued it) and the race detector's findings (``first`` and ``second``, each with the ``seq`` of
its op). Every op is a slice on its track (the host, or each of its threads, and each stream);
an event's record and the waits on that record are joined by an arrow, and so is each racing
pair, its two slices marked.

Where the ops carry device times (the simulated device always; the GPU with ``--timeline``) a
stream op's slice is when it ran; otherwise it is placed where the host issued it, and the
track's name says so.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HOST = "host"
ISSUE_SLICE_NS = 1_000
"""How long an op placed by issue time is drawn, at most: it ends where its track's next op
was issued, or this much later."""
UNTIMED = "placed where the host issued them: no device times (--timeline measures them)"
WAIT_KINDS = ("event_wait", "sync_event", "event_query")


@dataclass(frozen=True)
class Placed:
    """One op on its track, from ``start_ns`` to ``end_ns`` (``timed``: when it ran on the
    device, else where the host issued it)."""

    op: Mapping[str, Any]
    track: str
    start_ns: float
    end_ns: float
    timed: bool


THREAD = " · "
"""Between "host" and a host thread's name in its track's key (no stream name has it)."""


def track_of(op: Mapping[str, Any]) -> str:
    """An op's track: its stream, or the host (``host · T`` for the scenario's thread T)."""
    stream = str(op.get("stream"))
    detail = op.get("detail")
    if stream == HOST and isinstance(detail, Mapping) and detail.get("thread"):
        return f"{HOST}{THREAD}{detail['thread']}"
    return stream


def tracks(ops: Sequence[Mapping[str, Any]], streams: Sequence[str] = ()) -> list[str]:
    """The host's track and its threads' as the ops first use them, then the streams: in
    ``streams``' order, then as the ops first use them."""
    used = [track_of(op) for op in ops]
    out = [HOST, *dict.fromkeys(t for t in used if t.startswith(HOST + THREAD))]
    for name in [*streams, *used]:
        if name not in out:
            out.append(name)
    return out


def place(ops: Sequence[Mapping[str, Any]]) -> list[Placed]:
    """Each op as a slice on its track (see the module docstring)."""
    issued: dict[str, list[float]] = {}
    for op in ops:
        issued.setdefault(track_of(op), []).append(_ns(op.get("t_issue_ns")))
    nth: dict[str, int] = {}
    out = []
    for op in ops:
        track = track_of(op)
        k = nth[track] = nth.get(track, -1) + 1
        start, end = op.get("t_start_ns"), op.get("t_end_ns")
        if isinstance(start, (int, float)) and isinstance(end, (int, float)):
            out.append(Placed(op, track, float(start), max(float(end), float(start)), True))
            continue
        at = issued[track][k]
        later = issued[track][k + 1] if k + 1 < len(issued[track]) else at + ISSUE_SLICE_NS
        out.append(Placed(op, track, at, at + max(1.0, min(later - at, ISSUE_SLICE_NS)),
                          track == HOST or track.startswith(HOST + THREAD)))
    return out


def _ns(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def racing_pairs(findings: Iterable[Mapping[str, Any]]) -> list[tuple[int, int, str]]:
    """(first seq, second seq, the missing edge in words) of each finding."""
    pairs = []
    for f in findings:
        first, second = f.get("first"), f.get("second")
        if isinstance(first, Mapping) and isinstance(second, Mapping):
            try:
                pairs.append((int(first["seq"]), int(second["seq"]), str(f.get("missing", ""))))
            except (KeyError, TypeError, ValueError):
                continue
    return pairs


def event_arrows(ops: Sequence[Mapping[str, Any]]) -> list[tuple[int, int, str]]:
    """(record seq, wait seq, event) for each wait on an event (a stream's wait, the host's
    synchronize, a query that saw it done) and the record it waited for: the latest one
    issued before it."""
    latest: dict[str, int] = {}
    arrows = []
    for op in ops:
        kind = op.get("kind")
        if kind == "event_record" and op.get("records") is not None:
            latest[str(op["records"])] = int(op["seq"])
        elif kind in WAIT_KINDS and op.get("waits") is not None:
            detail = op.get("detail") if isinstance(op.get("detail"), Mapping) else {}
            if kind == "event_query" and not detail.get("done"):
                continue
            record = latest.get(str(op["waits"]))
            if record is not None:
                arrows.append((record, int(op["seq"]), str(op["waits"])))
    return arrows


# ---- the Chrome trace ------------------------------------------------------------------------

def chrome_trace(records: Iterable[Mapping[str, Any]],
                 findings: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A trace's records (header, buffer, stream, op lines) and findings as a Chrome Trace
    Event Format document (a ``traceEvents`` list, times in µs)."""
    header: Mapping[str, Any] = {}
    buffers: dict[int, str] = {}
    streams: dict[str, Mapping[str, Any]] = {}
    ops: list[Mapping[str, Any]] = []
    times: dict[int, tuple[int, int]] = {}
    for record in records:
        kind = record.get("type")
        if kind == "header":
            header = record
        elif kind == "buffer":
            buffers[int(record["id"])] = str(record.get("name", record["id"]))
        elif kind == "stream":
            streams[str(record["name"])] = record
        elif kind == "op":
            ops.append(record)
        elif kind == "times":  # device times measured after the ops (--timeline)
            times.update((int(seq), (start, end)) for seq, start, end in record.get("ops", []))
    if times:
        ops = [{**op, "t_start_ns": times[op["seq"]][0], "t_end_ns": times[op["seq"]][1]}
               if op.get("seq") in times else op for op in ops]
    placed = place(ops)
    names = tracks(ops, list(streams))
    tid = {name: i + 1 for i, name in enumerate(names)}
    untimed = {p.track for p in placed if not p.timed}  # streams only: host ops are timed
    title = f"gpurace {header.get('scenario', '?')} [{header.get('variant', '?')}] trial " \
            f"{header.get('trial', '?')} ({header.get('backend', '?')})"
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": title}}]
    for name in names:
        label = _host_label(name) if name.startswith(HOST) and name not in streams else \
            f"stream {name}{_flavour(streams.get(name))}"
        if name in untimed:
            label += f" ({UNTIMED})"
        events += [{"ph": "M", "pid": 1, "tid": tid[name], "name": "thread_name",
                    "args": {"name": label}},
                   {"ph": "M", "pid": 1, "tid": tid[name], "name": "thread_sort_index",
                    "args": {"sort_index": tid[name]}}]
    pairs = racing_pairs(findings)
    racing = {seq for a, b, _ in pairs for seq in (a, b)}
    origin = min((p.start_ns for p in placed), default=0.0)
    at: dict[int, tuple[float, int]] = {}  # seq -> (ts, tid) of its slice
    for p in placed:
        seq = int(p.op["seq"])
        ts = (p.start_ns - origin) / 1000
        at[seq] = (ts, tid[p.track])
        slice_ = {"ph": "X", "pid": 1, "tid": tid[p.track], "ts": ts,
                  "dur": max(p.end_ns - p.start_ns, 1.0) / 1000,
                  "name": _label(p.op), "cat": "race" if seq in racing else "op",
                  "args": _args(p.op, buffers)}
        if seq in racing:
            slice_["cname"] = "terrible"  # Chrome's reserved red
            slice_["name"] = "RACE " + slice_["name"]
        events.append(slice_)
    flow = 0
    for cat, arrows in (("event", event_arrows(ops)), ("race", pairs)):
        for first, second, name in arrows:
            if first not in at or second not in at:
                continue
            flow += 1
            (ts_a, tid_a), (ts_b, tid_b) = at[first], at[second]
            common = {"pid": 1, "cat": cat, "id": flow,
                      "name": f"event {name}" if cat == "event" else f"race: {name}"}
            events.append({**common, "ph": "s", "tid": tid_a, "ts": ts_a})
            events.append({**common, "ph": "f", "bp": "e", "tid": tid_b, "ts": ts_b})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"source": "gpurace", "schema": header.get("schema"),
                          "device_times": not untimed}}


def _host_label(track: str) -> str:
    return "host" if track == HOST else f"host thread {track[len(HOST + THREAD):]}"


def _flavour(stream: Mapping[str, Any] | None) -> str:
    if not stream:
        return ""
    if stream.get("legacy"):
        return " (legacy)"
    return " (blocking)" if stream.get("blocking") else " (non-blocking)"


def _label(op: Mapping[str, Any]) -> str:
    return f"{op.get('kind')}" + (f" · {op['step']}" if op.get("step") else "")


def _args(op: Mapping[str, Any], buffers: Mapping[int, str]) -> dict[str, Any]:
    args: dict[str, Any] = {"seq": op.get("seq"), "step": op.get("step")}
    for key in ("reads", "writes"):
        if op.get(key):
            args[key] = [_span(r, buffers) for r in op[key]]
    for key in ("records", "waits", "syncs"):
        if op.get(key) is not None:
            args[key] = op[key]
    detail = op.get("detail")
    if isinstance(detail, Mapping):
        args.update({k: v for k, v in detail.items() if k not in args})
    return args


def _span(item: Any, buffers: Mapping[int, str]) -> str:
    try:
        buffer, offset, length = item
        name = buffers.get(int(buffer), f"b{buffer}")
        return f"{name}[{int(offset)}, {int(offset) + int(length)})"
    except (TypeError, ValueError):
        return str(item)


# ---- the SVG ---------------------------------------------------------------------------------

_SVG_STYLE = """
text { font: 11px monospace; }
.band { fill: #fafafa; stroke: #e4e4e4; }
.name { fill: #333; }
.axis { fill: #777; }
.op rect { fill: #cfe0f5; stroke: #6d8fb8; }
.op .seq { text-anchor: middle; fill: #234; font-size: 9px; }
.race rect { fill: #f6b3b3; stroke: #c00; stroke-width: 2.5; }
line.wait { stroke: #888; stroke-dasharray: 3 2; fill: none; }
line.pair { stroke: #c00; stroke-width: 2; fill: none; }
marker path { fill: #666; }
"""
"""The SVG's own styles: it reads the same inline in a page and as a file of its own."""

SVG_OPS = 60
"""Ops an incident's SVG shows: the last ones (report.md's table shows fewer)."""
LANE_H = 34
COLUMN_W = 30
LEFT = 150
TOP = 24


def svg_timeline(ops: Sequence[Mapping[str, Any]],
                 findings: Iterable[Mapping[str, Any]] = ()) -> str:
    """The ops as boxes in issue order, one lane per track, the racing pairs red and joined,
    an event's waits joined to its record: an inline SVG with a <title> on every box."""
    ops = [op for op in ops if isinstance(op, Mapping) and isinstance(op.get("seq"), int)]
    names = tracks(ops)
    lane = {name: i for i, name in enumerate(names)}
    pairs = racing_pairs(findings)
    racing = {seq for a, b, _ in pairs for seq in (a, b)}
    width = LEFT + COLUMN_W * max(len(ops), 1) + 20
    height = TOP + LANE_H * len(names) + 10
    where: dict[int, tuple[float, float]] = {}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="the last ops, one lane per stream">',
           f'<style>{_SVG_STYLE}</style><rect width="100%" height="100%" fill="white"/>',
           '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="6" '
           'markerHeight="6" orient="auto"><path d="M0,0 L8,4 L0,8 z"/></marker></defs>',
           f'<text x="{LEFT}" y="14" class="axis">ops in the order the host issued them '
           '&#8594;</text>']
    for name in names:
        y = TOP + lane[name] * LANE_H
        label = name.replace(THREAD, " ")
        out.append(f'<g class="lane" data-lane="{html.escape(name)}">'
                   f'<rect x="0" y="{y}" width="{width}" height="{LANE_H}" class="band"/>'
                   f'<text x="8" y="{y + LANE_H / 2 + 4}" class="name">'
                   f'{html.escape(label)}</text></g>')
    for i, op in enumerate(ops):
        seq = op["seq"]
        x = LEFT + i * COLUMN_W
        y = TOP + lane[track_of(op)] * LANE_H + 5
        where[seq] = (x + (COLUMN_W - 4) / 2, y + (LANE_H - 10) / 2)
        cls = "op race" if seq in racing else "op"
        tip = f"seq {seq} · {op.get('stream')} · {_label(op)}"
        for key in ("reads", "writes"):
            if op.get(key):
                tip += f" · {key} " + ", ".join(_span(r, {}) for r in op[key][:3])
        out.append(f'<g class="{cls}" data-seq="{seq}"><title>{html.escape(tip)}</title>'
                   f'<rect x="{x}" y="{y}" width="{COLUMN_W - 4}" height="{LANE_H - 10}" '
                   f'rx="3"/><text x="{x + (COLUMN_W - 4) / 2}" y="{y + LANE_H / 2}" '
                   f'class="seq">{seq}</text></g>')
    for cls, arrows in (("wait", event_arrows(ops)), ("pair", pairs)):
        for first, second, name in arrows:
            if first in where and second in where:
                (x1, y1), (x2, y2) = where[first], where[second]
                # From edge to edge, not middle to middle: the line must not hide the seqs.
                length = max(((x2 - x1) ** 2 + (y2 - y1) ** 2) ** 0.5, 1.0)
                dx, dy = (x2 - x1) / length * COLUMN_W / 2, (y2 - y1) / length * COLUMN_W / 2
                x1, y1, x2, y2 = x1 + dx, y1 + dy, x2 - dx, y2 - dy
                out.append(f'<line class="{cls}" x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" '
                           f'marker-end="url(#arrow)"><title>{html.escape(name)}</title>'
                           '</line>')
    out.append("</svg>")
    return "\n".join(out)
