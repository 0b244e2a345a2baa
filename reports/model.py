"""The report model: its schema name, its one error, and tolerant readers of its fields.

Reports are plain dicts written by the harness (schema ``gpurace.report/1``). Only ``schema``,
``scenario``, ``variant``, ``trial`` and ``outcome`` are required; the readers here accept the
documented shapes (``{"name": ...}`` objects) and bare values alike, so a renderer never
crashes on a report from a slightly different producer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REPORT_SCHEMA = "gpurace.report/1"
RUN_SCHEMA = "gpurace.run/1"
REQUIRED_KEYS = ("schema", "scenario", "variant", "trial", "outcome")


class ReportError(ValueError):
    """A report is missing, unreadable or not a ``gpurace.report/1`` document.

    The message names the file and what is wrong with it. Re-run the trial (its report says
    how, under "Reproduce") to get a fresh report, or read it with the gpurace version that
    wrote it.
    """


def check_report(report: Any, where: str = "report") -> dict[str, Any]:
    """Return ``report`` if it is a dict of our schema with the required keys, else raise
    :class:`ReportError` saying what is wrong and what to do."""
    if not isinstance(report, dict):
        raise ReportError(f"{where}: expected a JSON object, found {type(report).__name__}; "
                          "this is not a gpurace report")
    schema = report.get("schema")
    if schema is None:
        raise ReportError(f"{where}: no 'schema' key; this is not a gpurace report "
                          f"(expected schema {REPORT_SCHEMA!r})")
    if schema != REPORT_SCHEMA:
        raise ReportError(f"{where}: schema is {schema!r}, expected {REPORT_SCHEMA!r}; read it "
                          "with the gpurace version that wrote it, or re-run the trial")
    missing = [key for key in REQUIRED_KEYS if key not in report]
    if missing:
        raise ReportError(f"{where}: missing required key(s) {', '.join(missing)}; the report "
                          "is incomplete, re-run the trial to get a fresh one")
    return report


def name_of(value: Any) -> str:
    """The name of a ``{"name": ...}`` object, or the value itself as text."""
    if isinstance(value, Mapping):
        value = value.get("name")
    return "?" if value is None else str(value)


def section(report: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``report[key]`` when it is an object, else an empty one (absent, null or a bare value)."""
    value = report.get(key)
    return value if isinstance(value, Mapping) else {}


def trial_index(report: Mapping[str, Any]) -> Any:
    """The trial's index: ``trial.index``, or ``trial`` itself when it is a bare number."""
    trial = report.get("trial")
    return trial.get("index") if isinstance(trial, Mapping) else trial


def xid_numbers(xids: Any) -> list[int]:
    """The Xid numbers of a list of Xid records (``{"xid": 43, ...}``) or of bare numbers."""
    numbers = []
    for xid in xids or []:
        value = xid.get("xid") if isinstance(xid, Mapping) else xid
        try:
            numbers.append(int(value))
        except (TypeError, ValueError):
            continue  # a malformed entry must not hide the others
    return numbers
