"""Incident folders: one per trial that went wrong, holding everything a ticket needs.

A folder ``<YYYYmmdd-HHMMSS>-<scenario>-<variant>-t<trial>`` holds ``report.json`` (the
canonical ``gpurace.report/1`` document), ``report.md`` and ``report.html`` (for humans; both
show ``timeline.svg``, the last ops drawn), ``trace.jsonl`` (the trial's trace) with
``timeline.json`` (the same ops as a Chrome trace, for ui.perfetto.dev) and whatever else was
captured (kernel log, worker log). The folder is built
under a hidden temp name and renamed into place last, so a folder under its final name is
always complete, even if the writer was SIGKILLed half way.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reports.atomic import TEMP_SUFFIX, atomic_writer, current_umask, fsync_dir, write_atomic
from reports.html import render_html
from reports.markdown import HTML, SVG, TIMELINE, render_markdown
from reports.timeline import SVG_OPS, chrome_trace, svg_timeline
from reports.model import ReportError, check_report, name_of, trial_index, xid_numbers

REPORT_JSON = "report.json"
REPORT_MAX_BYTES = 8 << 20
"""Bytes of a report.json that gpurace reads back (it writes them with the last 300 ops: tens
of KiB); a larger file is not one of its reports."""
REPORT_MD = "report.md"
TRACE = "trace.jsonl"
RESERVED = (REPORT_JSON, REPORT_MD, HTML, TRACE, TIMELINE, SVG)
_TEMP_PREFIX = ".incident-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def write_incident(root: Path, report: dict[str, Any],
                   trace: Path | Iterable[str] | None,
                   extra: Mapping[str, str | Path] | None = None) -> Path:
    """Write a new incident folder under ``root`` and return it.

    ``trace`` is a trace file to copy, the trace's lines, or None. ``extra`` maps file names
    (``"kernel-log.txt"``, ``"worker.log"``) to their text, or to a file to copy (a file may be
    too large to hold in memory). ``report`` is updated in place:
    ``files`` lists what was written, ``trace`` names the trace file, and ``created`` is set
    when missing (it also dates the folder name).
    """
    check_report(report)
    extra = dict(extra or {})
    _check_extra_names(extra)
    report.setdefault("created", _now_iso())
    report["files"] = [REPORT_JSON, REPORT_MD, HTML] + (
        [TRACE, TIMELINE] if trace is not None else []) + (
        [SVG] if _last_ops(report) else []) + list(extra)
    if trace is not None:
        report["trace"] = TRACE
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=root))
    try:
        _fill(building, report, trace, extra)
        return _move_into_place(building, root, _folder_name(report))
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def _check_extra_names(extra: Mapping[str, str | Path]) -> None:
    for name in extra:
        if name in RESERVED or not name or name.startswith(".") or name != Path(name).name:
            raise ValueError(f"extra file name {name!r} is not allowed: use a plain file name "
                             f"that does not start with '.' and is not one of {RESERVED}")


def _fill(folder: Path, report: Mapping[str, Any], trace: Path | Iterable[str] | None,
          extra: Mapping[str, str | Path]) -> None:
    """Write the incident's files into ``folder``; report.json last, as the seal."""
    os.chmod(folder, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide it from the team
    if trace is not None:
        _write_trace(folder / TRACE, trace)
        write_atomic(folder / TIMELINE, json.dumps(chrome_trace(
            trace_records(folder / TRACE), report.get("findings") or []),
            separators=(",", ":"), default=str) + "\n")
    for name, content in extra.items():
        if isinstance(content, os.PathLike):
            _copy(content, folder / name)
        else:
            write_atomic(folder / name, content)
    if SVG in report["files"]:
        write_atomic(folder / SVG, svg_timeline(_last_ops(report)[-SVG_OPS:],
                                                report.get("findings") or []) + "\n")
    write_atomic(folder / HTML, render_html(report))
    write_atomic(folder / REPORT_MD, render_markdown(report))
    write_atomic(folder / REPORT_JSON, json.dumps(report, indent=2, default=str) + "\n")


def _copy(source: Path, path: Path) -> None:
    with open(source, "rb") as src, atomic_writer(path, "wb") as dst:
        shutil.copyfileobj(src, dst)


def _write_trace(path: Path, trace: Path | Iterable[str]) -> None:
    if isinstance(trace, (str, bytes)):
        raise TypeError("trace must be a Path or an iterable of lines, not a bare string")
    if isinstance(trace, os.PathLike):
        _copy(trace, path)
        return
    with atomic_writer(path, "w") as dst:
        for line in trace:
            dst.write(line if line.endswith("\n") else line + "\n")


def _last_ops(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [op for op in report.get("last_ops") or [] if isinstance(op, Mapping)]


def trace_records(path: Path) -> list[dict[str, Any]]:
    """An incident trace's records as written (a line that is not a JSON object is left out:
    a picture draws what it can). Raises OSError when it cannot be read."""
    records = []
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    records.append(record)
    return records


def _folder_name(report: Mapping[str, Any]) -> str:
    stamp = _parse_created(report.get("created")) or datetime.now(timezone.utc)
    parts = [stamp.strftime("%Y%m%d-%H%M%S"), _safe(name_of(report.get("scenario"))),
             _safe(name_of(report.get("variant"))), f"t{_safe(str(trial_index(report)))}"]
    return "-".join(parts)


def _safe(text: str) -> str:
    """A name fit for a folder: no separators, no leading dot."""
    return _UNSAFE.sub("-", text).lstrip(".-") or "x"


def _move_into_place(building: Path, root: Path, name: str) -> Path:
    """Rename ``building`` to ``root/name`` (or ``name-2``, ``name-3``…), never over another
    incident."""
    for n in range(1, 10_000):
        final = root / (name if n == 1 else f"{name}-{n}")
        if final.exists() or final.is_symlink():
            continue
        try:
            # rename() fails on a non-empty target, so two writers racing for one name
            # can't clobber each other: the loser moves on to the next suffix.
            os.rename(building, final)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                continue
            raise
        fsync_dir(root)
        return final
    raise ReportError(f"{root}: no free incident folder name for {name!r}; clean up old "
                      "incidents")


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_created(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    # Folder names are in UTC, like "created", whatever zone the writer's clock is in.
    return stamp.astimezone(timezone.utc) if stamp.tzinfo else stamp


def load_report(path: Path) -> dict[str, Any]:
    """The report of an incident folder, or of a ``report.json`` path, validated.

    Raises :class:`ReportError` saying what is wrong when it is missing, not JSON, or not a
    ``gpurace.report/1`` document.
    """
    path = Path(path)
    file = path / REPORT_JSON if path.is_dir() else path
    try:
        # Only a regular file of a report's size: a FIFO would block the read for ever, a
        # huge file fill memory (gpurace writes reports of tens of KiB).
        info = file.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ReportError(f"{file}: not a regular file; pass an incident folder written by "
                              "gpurace (or its report.json)")
        if info.st_size > REPORT_MAX_BYTES:
            raise ReportError(f"{file}: {info.st_size:,} bytes is more than a report may have "
                              f"({REPORT_MAX_BYTES >> 20} MiB); it is not a gpurace report")
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        where = f"{path} has no {REPORT_JSON}" if path.is_dir() else f"{path} does not exist"
        raise ReportError(f"{where}; pass an incident folder written by gpurace "
                          "(or its report.json)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{file}: cannot be read ({exc})") from exc
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{file}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg}); the "
                          "file is damaged or is not a gpurace report") from None
    return check_report(report, str(file))


def list_incidents(root: Path) -> list[dict[str, Any]]:
    """A summary of each incident folder under ``root``, oldest first: directly under it, or
    one level down (in the run folders a run makes under its ``--out``).

    Each is ``{path, created, scenario, variant, trial, outcome, cuda_error, xids}``; a folder
    whose report can't be read is listed as ``{path, error}`` rather than stopping the listing.
    Hidden folders (temp folders of writers still at work or killed) are skipped.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    summaries = []
    for folder in _incident_folders(root):
        try:
            summaries.append(_summary(folder, load_report(folder)))
        except ReportError as exc:
            summaries.append({"path": str(folder), "error": str(exc)})
    summaries.sort(key=_sort_key)
    return summaries


def _incident_folders(root: Path, depth: int = 2) -> list[Path]:
    found = []
    for folder in sorted(root.iterdir()):
        if folder.name.startswith(".") or folder.is_symlink() or not folder.is_dir():
            continue
        if (folder / REPORT_JSON).is_file():
            found.append(folder)
        elif depth > 1:
            found += _incident_folders(folder, depth - 1)
    return found


def _sort_key(summary: Mapping[str, Any]) -> tuple[datetime, str]:
    """When the incident was created: its report's ``created``, else (a broken report) the
    time its folder name starts with; the folder name breaks ties."""
    name = Path(summary["path"]).name
    stamp = _parse_created(summary.get("created"))
    if stamp is None:
        with contextlib.suppress(ValueError):
            stamp = datetime.strptime(name[:15], "%Y%m%d-%H%M%S")
    return (stamp or datetime.min).replace(tzinfo=None), name


def _summary(folder: Path, report: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "path": str(folder),
        "created": report.get("created"),
        "scenario": name_of(report.get("scenario")),
        "variant": name_of(report.get("variant")),
        "trial": trial_index(report),
        "outcome": report.get("outcome"),
        "cuda_error": report.get("cuda_error"),
        "xids": xid_numbers(report.get("xids")),
    }

