"""gpurace's reports: renderers of one canonical report model, and the files they go into.

An incident report is a plain dict of schema ``gpurace.report/1`` built by the harness for a
trial that went wrong (crash, corruption, hang, a detected race); a run document
(``gpurace.run/1``) sums up a whole run. This package only renders and stores such dicts: it
never imports ``harness`` or ``kvcore``, so reports can be read and re-rendered anywhere.

- :func:`write_incident` writes an incident folder (``report.json``, ``report.md``,
  ``trace.jsonl``, captured logs); :func:`list_incidents` and :func:`load_report` read them back.
- :func:`render_markdown` gives the human report, :func:`render_junit` the CI view of a run.
- :func:`write_atomic` and :func:`atomic_writer` write files so that no reader ever sees half
  of one, even after a SIGKILL; :func:`remove_stale_temps` sweeps up what killed writers left.

PYTEST_DONT_REWRITE: its asserts are not a test's. pytest, run under `gpurace watch`, finds
this package imported already and would warn that it cannot rewrite them.
"""

from reports.atomic import atomic_writer, remove_stale_temps, write_atomic
from reports.incident import list_incidents, load_report, write_incident
from reports.junit import percent_interval, render_junit
from reports.markdown import render_markdown
from reports.model import REPORT_SCHEMA, RUN_SCHEMA, ReportError

__all__ = [
    "REPORT_SCHEMA",
    "RUN_SCHEMA",
    "ReportError",
    "atomic_writer",
    "list_incidents",
    "load_report",
    "percent_interval",
    "remove_stale_temps",
    "render_junit",
    "render_markdown",
    "write_atomic",
    "write_incident",
]
