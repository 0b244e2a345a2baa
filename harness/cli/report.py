"""`gpurace report`: incident reports listed and shown, and a sweep's race window drawn.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markdown import Markdown
from rich.markup import escape

from harness.limits import RUN_MAX_BYTES
from harness.inputs import Unreadable, read_input
from reports import ReportError, list_incidents, load_report, render_markdown
from harness.run.outputs import check_file
from reports.window import plot_png, sweep_window, trace_gaps
from harness.cli.app import main
from harness.cli.options import format_option
from harness.cli.output import _echo, out
from harness.words import counted


@main.group("report")
def report_group() -> None:
    """Incident reports: list them, show one; a sweep's race window as a picture."""


@report_group.command("window")
@click.argument("run", type=click.Path(exists=True, path_type=Path))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the PNG.")
def report_window(run: Path, output: Path) -> None:
    """Draw the race window of a `--sweep` run (its run.json, or its folder) as a PNG: the
    rate against the injected delay per variant, with Wilson 95% intervals and the measured
    interpreter gap, as `run --sweep` draws it where matplotlib is installed. For a sweep made
    on a machine without it (pip install 'gpurace[plot]' here)."""
    check_file(output, "--output")
    path = run / "run.json" if run.is_dir() else run
    try:
        # Through the one reader, as merge reads run documents: a pipe, a device or an
        # oversized file is refused before it is read.
        document = json.loads(read_input(path, RUN_MAX_BYTES, "a run document"))
        saved = document.get("window") or {}
        gaps = {k: [float(v)] for k, v in (saved.get("interpreter_gap_us") or {}).items()}
        window = sweep_window(document["results"], gaps or trace_gaps(document["results"]))
    except (Unreadable, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ReportError(f"{path}: not a gpurace run document ({exc}); pass a run's "
                          "run.json or folder") from None
    if not window.points:
        raise ReportError(f"{path}: no sweep in this run; run it with `gpurace run --sweep`")
    try:
        plot_png(window, output)
    except ImportError:
        raise ReportError("matplotlib is not installed: pip install 'gpurace[plot]'") from None
    out.print(f"{output}: {counted(len(window.curves()), 'curve')}, "
              f"{counted(len(window.points), 'point')}",
              highlight=False)


@report_group.command("list")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path),
                default=Path("gpurace-reports"))
@format_option()
def report_list(folder: Path, fmt: str) -> None:
    """List the incidents under FOLDER (a run's --out, default gpurace-reports)."""
    if not folder.is_dir():
        raise ReportError(f"{folder}: no such folder; pass a run's --out folder")
    items = list_incidents(folder)
    if fmt == "json":
        _echo(json.dumps(items, indent=2))
        return
    if not items:
        out.print(f"no incidents under {folder}")
        return
    for item in items:
        if "error" in item:
            out.print(f"[red]unreadable[/] {escape(str(item['path']))}: {escape(item['error'])}")
            continue
        xids = ", ".join(f"Xid {x}" for x in item.get("xids") or []) or "no Xids"
        out.print(f"{item['path']}\n    {item.get('created', '')}  {item.get('scenario')} "
                  f"({item.get('variant')}) trial {item.get('trial')}: {item.get('outcome')}"
                  f" {item.get('cuda_error') or ''} ({xids})", highlight=False)


@report_group.command("show")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@format_option(choices=("markdown", "json"))
def report_show(path: Path, fmt: str) -> None:
    """Show one incident (its folder or its report.json): what to paste into a ticket."""
    report = load_report(path)
    if fmt == "json":
        _echo(json.dumps(report, indent=2))
    elif out.is_terminal:
        out.print(Markdown(render_markdown(report)))
    else:
        _echo(render_markdown(report))
