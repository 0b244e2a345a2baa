"""`gpurace list`, `gpurace schema` and `gpurace steps`: what scenarios and suites there are,
the JSON schemas of gpurace's documents, and what a scenario's steps can say.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import click
from rich import box
from rich.markup import escape
from rich.table import Table

from harness.errors import TargetError
from harness import schemas
from harness.lang import vocabulary
from harness.lang.model import Scenario, Suite
from harness.results.exitcodes import ExitCode
from harness.lang.targets import catalog
from harness.cli.app import main
from harness.cli.options import PATH_OPTION, format_option
from harness.cli.output import _echo, err, out


LIST_SCHEMA = "gpurace.list/1"


@main.command("list")
@PATH_OPTION
@format_option()
def list_cmd(paths: Sequence[Path], fmt: str) -> None:
    """List the scenarios and suites gpurace knows: the built-in ones, and those of --path and
    GPURACE_PATH folders (run them by name). Files that do not load are listed with their
    error, and make the exit code 2."""
    listed = catalog(tuple(paths))
    if fmt == "json":
        _echo(json.dumps({"schema": LIST_SCHEMA,
                          "documents": [_describe(d) for d in listed.documents],
                          "broken": [{"path": str(p), "error": e}
                                     for p, e in listed.broken]}, indent=2))
    else:
        table = Table(title="scenarios and suites", show_lines=False)
        for column in ("name", "kind", "dangerous", "variants", "description"):
            table.add_column(column, overflow="fold")
        for doc in listed.documents:
            d = _describe(doc)
            table.add_row(d["name"], d["kind"], "yes" if d.get("dangerous") else "",
                          ", ".join(d.get("variants", [])), d["description"])
        out.print(table)
        for path, error in listed.broken:
            err.print(f"[bold red]cannot load[/] {escape(str(path))}: {escape(error)}",
                      highlight=False, soft_wrap=True)
    if listed.broken:
        sys.exit(int(ExitCode.USAGE))


@main.command("schema")
@click.argument("name", required=False)
def schema_cmd(name: str | None) -> None:
    """Print the JSON Schema (draft 2020-12) of a document gpurace writes or reads: run,
    report, trace-record, ticket-record, list, check, explore, or scenario (scenario and suite
    YAML, for editors: point yaml-language-server at it). Without NAME, list the names."""
    if name is None:
        _echo("\n".join(schemas.names()))
        return
    if name not in schemas.names():
        raise TargetError(f"no schema {name!r}; gpurace has {', '.join(schemas.names())}")
    _echo(schemas.text(name), nl=False)


@main.command("steps")
@format_option()
def steps_cmd(fmt: str) -> None:
    """The step vocabulary of scenario files: every op, its keys (required ones marked *), and
    what it does. Any step may also carry `id`, `only` or `unless` (a variant name or a list)
    to run in some variants only, and `thread` (a host thread's name: consecutive steps with a
    thread run as concurrent threads)."""
    ops = {op: {"keys": {k: {"holds": vocabulary.IN_WORDS[key.holds], "required": key.required}
                         for k, key in spec.keys.items()}, "does": spec.doc}
           for op, spec in vocabulary.OPS.items()}
    if fmt == "json":
        _echo(json.dumps(ops, indent=2))
        return
    table = Table(title="scenario steps", box=box.SIMPLE_HEAD)
    for column in ("op", "keys", "what it does"):
        table.add_column(column)
    for op, spec in ops.items():
        keys = ", ".join(f"{k}{'*' if v['required'] else ''}: {v['holds']}"
                         for k, v in spec["keys"].items())
        table.add_row(op, keys or "-", spec["does"])
    out.print(table)


def _describe(doc: Scenario | Suite) -> dict:
    if isinstance(doc, Suite):
        return {"name": doc.name, "kind": "suite", "path": str(doc.path),
                "description": doc.description,
                "scenarios": [str(p) for p in doc.scenarios]}
    return {"name": doc.name, "kind": "scenario", "path": str(doc.path),
            "description": doc.description, "dangerous": doc.dangerous,
            "variants": [v.name for v in doc.variants]}
