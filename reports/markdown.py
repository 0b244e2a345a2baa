"""The human report: Markdown a developer pastes into a ticket.

It leads with what happened and where, then what the GPU said (Xids, kernel log, the worker's
device log), the last ops before the end, and the command that replays the trial. Every section
copes with a report that lacks its optional keys.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from reports.model import name_of, section, trial_index

LAST_OPS = 20
HTML = "report.html"
TIMELINE = "timeline.json"
SVG = "timeline.svg"
DEVICE_LOG_LINES = 40
MAX_RANGES = 3


def render_markdown(report: Mapping[str, Any]) -> str:
    """The incident ``report`` (``gpurace.report/1``) as Markdown."""
    parts = [
        _title(report),
        _summary(report),
        _facts(report),
        _races(report),
        _gpu_said(report),
        _kernel_log(report),
        _device_log(report),
        _last_ops(report),
        _reproduce(report),
        _files(report),
    ]
    return "\n\n".join(part for part in parts if part) + "\n"


# -- text helpers ---------------------------------------------------------------------------

def _code(text: Any) -> str:
    """An inline code span that survives backticks inside ``text``."""
    text = str(text)
    fence = "`" * (_longest_backtick_run(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _code_block(text: str, lang: str = "") -> str:
    # A log may itself contain ``` (a pasted Markdown snippet, a Python traceback of one):
    # the fence must be longer than any run of backticks inside.
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    return f"{fence}{lang}\n{text.rstrip(chr(10))}\n{fence}"


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def _cell(value: Any) -> str:
    """A table cell: one line, pipes escaped."""
    text = " ".join(str(value).split())
    return text.replace("|", "\\|")


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def _lines(value: Any) -> list[str]:
    """Log text given as one string or as a list of lines."""
    if not value:
        return []
    if isinstance(value, str):
        return value.splitlines()
    return [str(line) for line in value]


def _seconds(value: Any) -> str:
    try:
        return f"{float(value):.3f} s"
    except (TypeError, ValueError):
        return str(value)


def _number(value: Any) -> str:
    """1000.0 as 1000, 2.5 as 2.5."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _cuda_version(value: Any) -> str:
    """CUDA's integer versions (13000) as people say them (13.0); other values as they are."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1000:
        return f"{value // 1000}.{value % 1000 // 10} ({value})"
    return str(value)


# -- sections -------------------------------------------------------------------------------

def _title(report: Mapping[str, Any]) -> str:
    scenario = name_of(report.get("scenario"))
    variant = name_of(report.get("variant"))
    return f"# gpurace incident: {scenario} ({variant}) — {report.get('outcome', '?')}"


def _summary(report: Mapping[str, Any]) -> str:
    variant = section(report, "variant")
    device = section(report, "device")
    where = f" at {report['step']}" if report.get("step") else ""
    backend = report.get("backend") or device.get("backend")
    on = ""
    if device.get("name"):
        on = f" on {device['name']}" + (f" ({backend})" if backend else "")
    elif backend:
        on = f" on the {backend} backend"
    sentences = [
        f"Trial {trial_index(report)} of scenario {_code(name_of(report.get('scenario')))}, "
        f"variant {_code(name_of(report.get('variant')))}, ended in "
        f"**{report.get('outcome', '?')}**{where}{on}."
    ]
    if report.get("detail"):
        detail = str(report["detail"]).rstrip(".")
        sentences.append(f"{detail[:1].upper()}{detail[1:]}.")
    if report.get("cuda_error"):
        sentences.append(f"CUDA error: {_code(report['cuda_error'])}.")
    sentences.append(_expectation(variant.get("expect"), report.get("outcome")))
    description = section(report, "scenario").get("description")
    if description:
        sentences.append(f"The scenario: {str(description).rstrip('.')}.")
    return " ".join(s for s in sentences if s)


def _expectation(expect: Any, outcome: Any) -> str:
    """Why this outcome matters: the variant's promise, and whether it was kept."""
    if expect == "reproduces":
        return "This variant is expected to reproduce the race."
    if expect == "clean" and outcome != "clean":
        return "This variant is expected to run clean: this is a regression."
    return ""


def _facts(report: Mapping[str, Any]) -> str:
    rows = [(label, value) for label, value in fact_rows(report) if value not in (None, "")]
    return "## Facts\n\n" + _table(["fact", "value"], rows)


def fact_rows(report: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The facts table's rows, (label, text with `code` spans); None where unknown."""
    scenario, variant = section(report, "scenario"), section(report, "variant")
    trial, device = section(report, "trial"), section(report, "device")
    rows: list[tuple[str, Any]] = [
        ("scenario", _scenario_fact(report, scenario)),
        ("variant", _variant_fact(report, variant)),
        ("backend", report.get("backend") or device.get("backend")),
        ("device", _device_fact(device)),
        *_version_facts(report),
        ("trial", _trial_fact(report, trial)),
        ("worker pid", trial.get("worker_pid")),
        ("duration", _seconds(trial["duration_s"]) if "duration_s" in trial else None),
        ("outcome", report.get("outcome")),
        ("CUDA error", _code(report["cuda_error"]) if report.get("cuda_error") else None),
        ("ended at", _ended_at(report)),
    ]
    if "amplification" in report:
        rows.append(("amplification", _amplification_fact(report["amplification"])))
    rows += [
        ("ops logged", report.get("ops_total")),
        ("health", section(report, "health").get("note")),
        ("created", report.get("created")),
    ]
    return rows


def _scenario_fact(report: Mapping[str, Any], scenario: Mapping[str, Any]) -> str:
    text = _code(name_of(report.get("scenario")))
    if scenario.get("path"):
        text += f" ({scenario['path']})"
    if scenario.get("dangerous"):
        text += ", dangerous"
    return text


def _variant_fact(report: Mapping[str, Any], variant: Mapping[str, Any]) -> str:
    text = _code(name_of(report.get("variant")))
    if variant.get("expect"):
        text += f", expects {variant['expect']}"
    bugs = variant.get("bugs")
    defects = variant.get("defects")
    if isinstance(bugs, list):
        # The pool's settings read like fixes (release_fence=false is the bug): name the bugs.
        text += (f"; known bugs switched on: {', '.join(map(str, bugs))}" if bugs else
                 "; no known bug switched on (the correct pool)")
    elif isinstance(defects, Mapping) and defects:  # a report written before "bugs"
        flags = ", ".join(f"{name}={str(on).lower()}" for name, on in defects.items())
        text += f"; pool settings: {flags}"
    return text


def _device_fact(device: Mapping[str, Any]) -> str | None:
    if not device.get("name"):
        return None
    cc = device.get("compute_capability")
    return f"{device['name']}" + (f" (compute capability {cc})" if cc else "")


def _version_facts(report: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Driver and CUDA versions, from the device info or else the health snapshots."""
    health = section(report, "health")
    sources = [section(report, "device"), *(h for h in (health.get("before"), health.get(
        "after")) if isinstance(h, Mapping))]

    def first(*keys: str) -> Any:
        for source in sources:
            for key in keys:
                if source.get(key) not in (None, ""):
                    return source[key]
        return None

    driver = first("driver_version", "driver")
    cuda = first("cuda_version", "cuda_driver_version", "runtime_version")
    return [
        ("driver", _cuda_version(driver) if driver is not None else None),
        ("CUDA", _cuda_version(cuda) if cuda is not None else None),
    ]


def _trial_fact(report: Mapping[str, Any], trial: Mapping[str, Any]) -> str:
    text = f"index {trial_index(report)}"
    if trial.get("seed") is not None:
        text += f", seed {trial['seed']}"
    if report.get("run_seed") is not None:
        text += f" (run seed {report['run_seed']})"
    return text


def _ended_at(report: Mapping[str, Any]) -> str | None:
    step, request = report.get("step"), report.get("request")
    if step and request is not None and str(request) not in str(step):
        return f"{step} (request {request})"
    if step:
        return str(step)
    return f"request {request}" if request is not None else None


def _amplification_fact(amp: Any) -> str:
    if not isinstance(amp, Mapping):
        return "none (no delay queued: the race ran at its natural width)"
    text = f"{_number(amp.get('delay_us', '?'))} µs delay"
    if amp.get("stream"):
        text += f" on {amp['stream']}"
    if amp.get("before"):
        text += f" before {amp['before']}"
    return text


def _gpu_said(report: Mapping[str, Any]) -> str:
    xids = [_xid_record(x) for x in report.get("xids") or []]
    head = "## GPU said\n\n"
    if not xids:
        note = report.get("xid_note") or "No Xids reported."
        return head + str(note)
    rows = [(x.get("xid", "?"), x.get("meaning", ""), x.get("class", ""), x.get("source", ""),
             x.get("pid", "") if x.get("pid") is not None else "", x.get("time") or "")
            for x in xids]
    table = _table(["Xid", "meaning", "class", "source", "pid", "time"], rows)
    note = f"\n\n{report['xid_note']}" if report.get("xid_note") else ""
    return head + table + note


def _races(report: Mapping[str, Any]) -> str:
    """The race detector's findings: each pair of unordered ops and the edge that is missing."""
    findings = [f for f in report.get("findings") or [] if isinstance(f, Mapping)]
    if not findings:
        return ""
    lines = ["## Races found", ""]
    for f in findings:
        pairs = f.get("count")
        count = f" ({pairs} op pairs)" if isinstance(pairs, int) and pairs > 1 else ""
        lines.append(f"- {f.get('missing', '?')}{count}")
        for side in ("first", "second"):
            op = f.get(side)
            if isinstance(op, Mapping):
                span = op.get("bytes") or ["?", "?"]
                # The scenario's line when a scenario issued it, else the Python line.
                site = f", at `{op['origin']}`" if op.get("origin") else (
                    f", issued at `{op['site']}`" if op.get("site") else "")
                lines.append(f"  - {side}: seq {op.get('seq')} on {op.get('stream')}: "
                             f"{op.get('kind')} {op.get('access')} of bytes "
                             f"[{span[0]}, {span[1]}){site}")
    return "\n".join(lines)


def _xid_record(xid: Any) -> Mapping[str, Any]:
    """An Xid record; a bare number (the harness always decodes them) shows without meaning."""
    if isinstance(xid, Mapping):
        return xid
    return {"xid": xid, "meaning": "", "class": ""}


def _kernel_log(report: Mapping[str, Any]) -> str:
    lines = _lines(report.get("kernel_log"))
    if not lines:
        return ""
    return "## Kernel log\n\n" + _code_block("\n".join(lines))


def _device_log(report: Mapping[str, Any]) -> str:
    lines = _lines(report.get("device_log"))
    if not lines:
        return ""
    tail = lines[-DEVICE_LOG_LINES:]
    head = "## Worker device log"
    if len(lines) > len(tail):
        head += f" (last {len(tail)} of {len(lines)} lines)"
    return head + "\n\n" + _code_block("\n".join(tail))


def _last_ops(report: Mapping[str, Any]) -> str:
    ops = [op for op in report.get("last_ops") or [] if isinstance(op, Mapping)]
    if not ops:
        return ""
    shown = ops[-LAST_OPS:]
    total = report.get("ops_total")
    intro = f"The last {len(shown)}"
    intro += f" of {total} ops" if total is not None else " ops"
    if report.get("trace"):
        intro += f" (the whole trace is in {_code(report['trace'])})"
    names = report.get("buffers") if isinstance(report.get("buffers"), Mapping) else {}
    intro += ("; byte ranges read `buffer[start,end)`." if names else
              "; byte ranges read `b<buffer>[start,end)`.")
    rows = [(op.get("seq", ""), op.get("stream", ""), op.get("kind", ""), op.get("step") or "",
             _ranges(op.get("reads"), names), _ranges(op.get("writes"), names)) for op in shown]
    table = _table(["seq", "stream", "kind", "step", "reads", "writes"], rows)
    picture = f"\n\n![The last ops, one lane per stream; the racing ops red]({SVG})" \
        if SVG in (report.get("files") or []) else ""
    return f"## Last ops before the end\n\n{intro}{picture}\n\n{table}"


def _ranges(ranges: Any, names: Mapping[str, Any] | None = None) -> str:
    """``[[3, 0, 64], ...]`` (buffer, offset, length) as ``kv-arena[0,64) +2 more``: the
    buffer by its name where the report names it (``buffers``), else ``b3``."""
    if not ranges:
        return ""
    texts = [_range(r, names or {}) for r in ranges[:MAX_RANGES]]
    extra = len(ranges) - MAX_RANGES
    return " ".join(texts) + (f" +{extra} more" if extra > 0 else "")


def _range(item: Any, names: Mapping[str, Any]) -> str:
    if isinstance(item, Mapping):
        item = (item.get("buffer"), item.get("offset"), item.get("length"))
    try:
        buffer, offset, length = item
        name = names.get(str(buffer)) or f"b{buffer}"
        return f"{name}[{offset},{int(offset) + int(length)})"
    except (TypeError, ValueError):
        return str(item)


def reproduce_command(report: Mapping[str, Any]) -> str | None:
    """The shell command that replays the trial, if the report has one."""
    reproduce = section(report, "reproduce")
    command = reproduce.get("command")
    if not command and reproduce.get("argv"):
        command = shlex.join(str(arg) for arg in reproduce["argv"])
    return str(command) if command else None


def _reproduce(report: Mapping[str, Any]) -> str:
    command = reproduce_command(report)
    if not command:
        return "## Reproduce\n\nNo command was recorded for this trial."
    return "## Reproduce\n\n" + _code_block(str(command), "sh")


def _files(report: Mapping[str, Any]) -> str:
    files = report.get("files") or []
    if not files:
        return ""
    what = {HTML: "this report as a page, with a timeline of the last ops",
            SVG: "the last ops, one lane per stream, the racing ops red",
            TIMELINE: "the whole trial as a timeline: open it in https://ui.perfetto.dev or "
                      "chrome://tracing"}
    return "## Files\n\n" + "\n".join(
        f"- [{name}]({name}): {what[name]}" if name in what else f"- {_code(name)}"
        for name in files)
