"""The incident page: report.html beside report.md, for people who would rather look than read.

One self-contained file (styles inline, no script, nothing fetched): what happened, the race in
words, a timeline of the last ops (one lane per stream, the racing pair in red and joined), what
the GPU said, and the command that reproduces the trial.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

from reports.markdown import LAST_OPS, fact_rows, reproduce_command
from reports.model import name_of, trial_index
from reports.timeline import SVG_OPS, svg_timeline

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 8px;
  text-align: left; vertical-align: top; }
code, pre { background: #f4f4f4; } pre { padding: 8px; overflow-x: auto; }
.bad { color: #b00; font-weight: bold; }
.scroll { overflow-x: auto; border: 1px solid #ddd; }
"""


def render_html(report: Mapping[str, Any]) -> str:
    """The incident ``report`` (``gpurace.report/1``) as one HTML page."""
    scenario, variant = name_of(report.get("scenario")), name_of(report.get("variant"))
    title = f"gpurace incident: {scenario} ({variant}) — {report.get('outcome', '?')}"
    parts = [f"<h1>{_e(title)}</h1>", _summary(report), _races(report), _timeline(report),
             _facts(report), _xids(report), _reproduce(report), _files(report)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>\n"
            + "\n".join(p for p in parts if p) + "\n</body></html>\n")


def _e(value: Any) -> str:
    return html.escape(str(value))


def _inline(text: Any) -> str:
    """Markdown's `code` spans as <code>, everything escaped."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))


def _summary(report: Mapping[str, Any]) -> str:
    where = f" at {_e(report['step'])}" if report.get("step") else ""
    text = (f"<p>Trial {_e(trial_index(report))} ended in <span class=\"bad\">"
            f"{_e(report.get('outcome', '?'))}</span>{where}.")
    if report.get("detail"):
        text += f" {_e(report['detail'])}"
    if report.get("cuda_error"):
        text += f" CUDA error: <code>{_e(report['cuda_error'])}</code>."
    return text + "</p>"


def _races(report: Mapping[str, Any]) -> str:
    findings = [f for f in report.get("findings") or [] if isinstance(f, Mapping)]
    if not findings:
        return ""
    items = "".join(f"<li>{_e(f.get('missing', '?'))}</li>" for f in findings)
    return f"<h2>Race found</h2><ul>{items}</ul>"


def _timeline(report: Mapping[str, Any]) -> str:
    ops = [op for op in report.get("last_ops") or [] if isinstance(op, Mapping)]
    if not ops:
        return ""
    shown = ops[-SVG_OPS:]
    note = (f"The last {len(shown)} ops" + (f" of {report['ops_total']}" if report.get(
        "ops_total") is not None else "") + ", one lane per stream and one for the host, in "
            "the order the host issued them; the racing ops are red and joined, an event's "
            "waits are joined to its record by dashed arrows. Hover a box for the op.")
    if report.get("trace"):
        note += (" The whole trial is in timeline.json (open it in ui.perfetto.dev) and "
                 f"{_e(report['trace'])}.")
    return (f"<h2>Timeline</h2><p>{note}</p><div class=\"scroll\">"
            f"{svg_timeline(shown, report.get('findings') or [])}</div>")


def _facts(report: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><th>{_e(label)}</th><td>{_inline(value)}</td></tr>"
                   for label, value in fact_rows(report) if value not in (None, ""))
    return f"<h2>Facts</h2><table>{rows}</table>"


def _xids(report: Mapping[str, Any]) -> str:
    xids = [x for x in report.get("xids") or [] if isinstance(x, Mapping)]
    if not xids:
        note = report.get("xid_note") or "No Xids reported."
        return f"<h2>GPU said</h2><p>{_e(note)}</p>"
    rows = "".join("<tr>" + "".join(f"<td>{_e(x.get(k, ''))}</td>" for k in (
        "xid", "meaning", "class", "source", "pid", "time")) + "</tr>" for x in xids)
    head = "".join(f"<th>{h}</th>" for h in ("Xid", "meaning", "class", "source", "pid",
                                             "time"))
    return f"<h2>GPU said</h2><table><tr>{head}</tr>{rows}</table>"


def _reproduce(report: Mapping[str, Any]) -> str:
    command = reproduce_command(report)
    if not command:
        return "<h2>Reproduce</h2><p>No command was recorded for this trial.</p>"
    return f"<h2>Reproduce</h2><pre>{_e(command)}</pre>"


def _files(report: Mapping[str, Any]) -> str:
    files = report.get("files") or []
    if not files:
        return ""
    items = "".join(f"<li><a href=\"{_e(name)}\">{_e(name)}</a></li>" for name in files)
    return f"<h2>Files</h2><ul>{items}</ul><p>Last ops as a table: report.md (the last " \
           f"{LAST_OPS}).</p>"

