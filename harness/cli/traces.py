"""`gpurace check` and `gpurace trace export`: an op trace analysed for races, and written out
as a Chrome trace or an SVG timeline.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from harness.limits import TRACE_MAX_BYTES
from harness.races.detector import check_trace
from harness.traces.optrace import load_trace, stream_trace
from reports import write_atomic
from harness.run.outputs import check_file
from reports.timeline import chrome_trace, svg_timeline
from harness.cli.app import main
from harness.cli.options import format_option
from harness.cli.output import _echo, print_finding, out
from harness.words import counted


CHECK_SCHEMA = "gpurace.check/1"


@main.command("check")
@click.argument("trace", type=click.Path(exists=True, dir_okay=True, path_type=Path))
@format_option()
def check_cmd(trace: Path, fmt: str) -> None:
    """Run the race detector over a recorded op trace (a trace.jsonl, or an incident folder):
    exit 1 when it finds races, 0 when none. A trace of any size is read (one over 8 MiB, such
    as a real program's watched run, a line at a time)."""
    path = _trace_file(trace)
    header, ops, findings = _checked(path)
    if fmt == "json":
        _echo(json.dumps({"schema": CHECK_SCHEMA, "trace": str(path),
                          "scenario": header.get("scenario"),
                          "variant": header.get("variant"),
                          "findings": [f.to_json() for f in findings]}, indent=2))
    else:
        what = f" ({header['scenario']}, variant {header.get('variant', '?')})" \
            if header.get("scenario") else ""
        out.print(f"{path}{what}: {counted(ops, 'op')}, "
                  f"{counted(len(findings), 'race')}",
                  highlight=False)
        for f in findings:
            print_finding(f.to_json())
    sys.exit(1 if findings else 0)


def _checked(path: Path) -> tuple[dict[str, Any], int, list[Any]]:
    """A trace's header, its ops and the races the detector finds in it: loaded whole, or,
    for one larger than a trace is loaded (a real program's watched run), read as a stream."""
    if not path.is_file() or path.stat().st_size <= TRACE_MAX_BYTES:
        trace = load_trace(path)
        return trace.header, len(trace.ops), check_trace(trace.records).findings
    seen: dict[str, Any] = {"header": None, "ops": 0}

    def counting(records: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for record in records:
            if seen["header"] is None:
                seen["header"] = record
            seen["ops"] += record.get("type") == "op"
            yield record

    findings = check_trace(counting(stream_trace(path))).findings
    return seen["header"], seen["ops"], findings


def _trace_file(trace: Path) -> Path:
    """TRACE as `check` and `trace export` take it: a trace.jsonl, or an incident folder."""
    if not trace.is_dir():
        return trace
    if not (trace / "trace.jsonl").exists():
        raise click.BadParameter(f"{trace} is a folder without a trace.jsonl: give an "
                                 "incident folder (gpurace report list shows them) or a trace "
                                 "file", param_hint="TRACE")
    return trace / "trace.jsonl"


@main.group("trace")
def trace_group() -> None:
    """Recorded op traces as pictures."""


@trace_group.command("export")
@click.argument("trace", type=click.Path(exists=True, dir_okay=True, path_type=Path))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write it: FILE.json for a Chrome trace, FILE.svg for a picture.")
def trace_export_cmd(trace: Path, output: Path) -> None:
    """Write an op trace (a trace.jsonl, or an incident folder) as a timeline. FILE.json: a
    Chrome trace, the Trace Event Format that https://ui.perfetto.dev and chrome://tracing
    open: a track for the host and one per stream, every op a slice (its step and byte ranges
    in its args), arrows from an event's record to the waits on it, and each racing pair that
    `gpurace check` finds marked red and joined (an incident folder has one already:
    timeline.json). FILE.svg: the same ops as boxes in issue order, a lane per stream, the
    racing pairs red (what report.html shows of the last ops)."""
    check_file(output, "--output")
    if output.suffix not in (".json", ".svg"):
        raise click.BadParameter("name a .json (Chrome trace) or .svg (picture) file",
                                 param_hint="--output")
    trace_file = load_trace(_trace_file(trace))
    findings = [f.to_json() for f in check_trace(trace_file.records).findings]
    if output.suffix == ".svg":
        write_atomic(output, svg_timeline(trace_file.ops, findings) + "\n")
        out.print(f"{output}: {counted(len(trace_file.ops), 'op')}, "
                  f"{counted(len(findings), 'race')} marked",
                  highlight=False)
        return
    document = chrome_trace(trace_file.records, findings)
    write_atomic(output, json.dumps(document, separators=(",", ":"), default=str) + "\n")
    timed = "device times" if document["otherData"]["device_times"] else \
        "stream ops placed where the host issued them (no device times in the trace)"
    out.print(f"{output}: {counted(len(trace_file.ops), 'op')}, "
              f"{counted(len(findings), 'race')} marked; "
              f"{timed}. Open it in https://ui.perfetto.dev", highlight=False)
