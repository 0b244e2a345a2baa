"""`gpurace doctor`: what this machine can run (the GPU, CuPy, the driver) and what to do
about what it cannot.
"""

from __future__ import annotations

import json
import sys

from rich import box
from rich.markup import escape
from rich.table import Table

from harness.capture.source import readiness
from harness.gpu.doctor import diagnose
from harness.cli.app import main
from harness.cli.options import format_option
from harness.cli.output import _echo, out


@main.command("doctor")
@format_option()
def doctor_cmd(fmt: str) -> None:
    """What works here: GPU, driver, CUDA, CuPy, NVML events, kernel log, which frameworks
    `gpurace watch` sees in this interpreter (PyTorch, CuPy, Triton), and a verdict."""
    report = diagnose()
    watch_checks, watch_line = readiness()
    report["checks"] += watch_checks
    report["verdict"].append(watch_line)
    if fmt == "json":
        _echo(json.dumps(report, indent=2))
    else:
        table = Table(title="gpurace doctor", box=box.SIMPLE_HEAD, show_header=False)
        table.add_column("check", no_wrap=True)
        table.add_column("ok", no_wrap=True)
        table.add_column("what it says")
        for check in report["checks"]:
            mark = "[green]yes[/]" if check["ok"] else "[yellow]no[/]"
            table.add_row(check["name"], mark, escape(check["detail"]))
        out.print(table)
        for line in report["verdict"]:
            out.print(f"  {escape(line)}", highlight=False)
    sys.exit(0)
