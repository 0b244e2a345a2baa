"""JUnit XML of a run (``gpurace.run/1``), in the shape GitLab and Jenkins read.

The structure is that of pytest's ``junit_family=xunit2`` output (the Jenkins xUnit plugin's
junit-10 schema), so any reader of pytest's files reads these, and a schema validator accepts
them (tests/schemas/junit-xunit2.xsd): ``<testsuites>`` carries counts and a time but no skip
count; a ``<testsuite>`` per scenario carries the scenario's ``<properties>`` (its file, the
backend, the seed, the run); a ``<testcase>`` per variant (per delay in a sweep) carries only
its class name, name and time, the seconds its trials took (the run document's ``wall_s``).
A suite's time is the sum of its cases', the run's the sum of its suites'.

A variant that broke its expectation is a ``<failure>`` whose message a CI page shows in one
line (the expectation, the outcome counts and the Xids) and whose text tells the rest: why, the
outcome counts, the first trial that went wrong, the race the detector found and the fix it
suggests, and the incident folders. Every other variant's figures are in its ``<system-out>``.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any


OUTCOMES = ("clean", "corruption", "crash", "hang")
XML_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'


def render_junit(run: Mapping[str, Any]) -> str:
    """The run document ``run`` as JUnit XML, with an XML declaration."""
    results = [r for r in run.get("results") or [] if isinstance(r, Mapping)]
    root = ET.Element("testsuites", name="gpurace")
    for scenario, group in _by_scenario(results).items():
        root.append(_testsuite(scenario, group, run))
    _set_counts(root, _counts(results), skipped=False)
    ET.indent(root)
    return XML_DECLARATION + ET.tostring(root, encoding="unicode") + "\n"


def _by_scenario(results: list[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Results grouped by scenario, scenarios in order of first appearance."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for result in results:
        groups.setdefault(str(result.get("scenario", "?")), []).append(result)
    return groups


def _counts(results: list[Mapping[str, Any]]) -> dict[str, Any]:
    statuses = [_status(r) for r in results]
    return {
        "tests": len(results),
        "failures": statuses.count("fail"),
        "errors": statuses.count("error"),
        "skipped": statuses.count("skip"),
        "time": sum(_result_time(r) for r in results),
    }


def _set_counts(element: ET.Element, counts: Mapping[str, Any], skipped: bool = True) -> None:
    """The counts and the time; ``skipped`` only where the schema has it (a testsuite)."""
    for key in ("tests", "failures", "errors", *(("skipped",) if skipped else ())):
        element.set(key, str(counts[key]))
    element.set("time", _time(counts["time"]))


def _time(seconds: float) -> str:
    return f"{seconds:.3f}"


def _status(result: Mapping[str, Any]) -> str:
    """pass, fail or skip; anything else is an error of the producer, shown as such."""
    status = result.get("status")
    return status if status in ("pass", "fail", "skip") else "error"


def _seconds(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return 0.0
    return seconds if 0.0 <= seconds < float("inf") else 0.0


def _result_time(result: Mapping[str, Any]) -> float:
    """The seconds a variant's trials took (``wall_s``: their durations added up)."""
    return _seconds(result.get("wall_s"))


def _testsuite(scenario: str, results: list[Mapping[str, Any]],
               run: Mapping[str, Any]) -> ET.Element:
    suite = ET.Element("testsuite", name=scenario)
    _set_counts(suite, _counts(results))
    device = run.get("device") if isinstance(run.get("device"), Mapping) else {}
    if device.get("name"):
        suite.set("hostname", str(device["name"]))  # the GPU is the "host" a test ran on
    suite.append(_properties(results, run, device))
    for result in results:
        suite.append(_testcase(scenario, result))
    return suite


def _properties(results: list[Mapping[str, Any]], run: Mapping[str, Any],
                device: Mapping[str, Any]) -> ET.Element:
    """What the scenario's variants share, and the run they were part of."""
    props = ET.Element("properties")
    paths = list(dict.fromkeys(str(r["path"]) for r in results if r.get("path")))
    dangerous = {r.get("dangerous") for r in results} - {None}
    shared = [*(("path", p) for p in paths),
              ("dangerous", dangerous.pop() if len(dangerous) == 1 else None),
              ("backend", run.get("backend")), ("device", device.get("name")),
              ("seed", run.get("seed")), ("run_id", run.get("run_id") or None),
              ("folder", run.get("folder") or None)]
    for name, value in shared:
        if value is not None:
            ET.SubElement(props, "property", name=name, value=_value(value))
    return props


def _testcase(scenario: str, result: Mapping[str, Any]) -> ET.Element:
    case = ET.Element("testcase", classname=f"gpurace.{scenario}", name=_case_name(result),
                      time=_time(_result_time(result)))
    status = _status(result)
    if status == "fail":
        failure = ET.SubElement(case, "failure", message=failure_message(result),
                                type=str(result.get("expect") or "expectation"))
        failure.text = _failure_text(result)
    elif status == "skip":
        ET.SubElement(case, "skipped", message=str(result.get("reason") or "skipped"))
    elif status == "error":
        ET.SubElement(case, "error", message=f"unknown status {result.get('status')!r}",
                      type="gpurace")
    out = _system_out(result, story=status != "fail")
    if out and status != "skip":
        ET.SubElement(case, "system-out").text = out
    return case


def _case_name(result: Mapping[str, Any]) -> str:
    name = str(result.get("variant", "?"))
    if result.get("sweep"):
        name += f"@{_number(result.get('delay_us'))}us"
    return name


def percent_interval(interval: Any) -> str:
    """``[0.9287, 1.0]`` as ``"92-100%"``: a rate's interval in whole percents, rounded
    outward so the words never claim more certainty than the figures; "" for no interval."""
    try:
        low, high = (float(x) for x in interval)
    except (TypeError, ValueError):
        return ""
    return f"{math.floor(low * 100 + 1e-9):.0f}-{math.ceil(high * 100 - 1e-9):.0f}%"


def _number(value: Any) -> str:
    """1000.0 as "1000", 2.5 as "2.5": test names must not change with float formatting."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _outcome_counts(result: Mapping[str, Any]) -> str:
    """``"crash 3, hang 1 of 200 trials"``: the outcomes that are not clean, or all clean."""
    outcomes = result.get("outcomes") if isinstance(result.get("outcomes"), Mapping) else {}
    trials = result.get("trials", 0)
    bad = [f"{name} {outcomes[name]}" for name in (*OUTCOMES[1:], *sorted(
        set(outcomes) - set(OUTCOMES))) if outcomes.get(name)]
    if not bad:
        return f"clean {outcomes.get('clean', trials)} of {trials} trials"
    return f"{', '.join(bad)} of {trials} trials"


def failure_message(result: Mapping[str, Any]) -> str:
    """One line for a CI page: ``"expected clean; crash 3 of 200 trials; Xid 43
    (application)"``."""
    expect = result.get("expect") or "?"
    parts = [f"expected {expect}", _outcome_counts(result)]
    if expect == "reproduces":
        trials = result.get("trials", 0)
        parts.append(f"manifested {result.get('manifested', 0)}/{trials}, "
                     f"race detected {result.get('detected', 0)}/{trials}")
        if result.get("min_rate"):
            parts[-1] += f", needed rate {_number(result['min_rate'])}"
    xids = summarize_xids(result.get("xids"))
    if xids:
        parts.append(xids)
    return "; ".join(parts)


def _failure_text(result: Mapping[str, Any]) -> str:
    """Why the variant failed, and where to look: the reason, the outcome counts, the first
    trial that went wrong, the race the detector found (and its fix), the incident folders."""
    lines = []
    if result.get("reason"):
        lines.append(str(result["reason"]))
    if result.get("trials"):
        lines.append("outcomes: " + _outcome_counts(result))
    first = result.get("first_manifested")
    if isinstance(first, Mapping):
        lines.append(_first_trial(first))
    lines += _race(result)
    if result.get("crash_requests"):
        requests = ", ".join(str(r) for r in result["crash_requests"])
        lines.append(f"crashed at request(s): {requests}")
    lines += _incidents(result)
    return "\n".join(lines)


def _first_trial(first: Mapping[str, Any]) -> str:
    text = f"first manifested: trial {first.get('index', '?')}"
    if first.get("seed") is not None:
        text += f" (seed {first['seed']})"
    text += f": {first.get('outcome', '?')}"
    if first.get("detail"):
        text += f": {first['detail']}"
    if first.get("cuda_error"):
        text += f" [{first['cuda_error']}]"
    return text


def _race(result: Mapping[str, Any]) -> list[str]:
    """The detector's first finding: the missing edge with its fix, and the two ops."""
    findings = [f for f in result.get("findings") or [] if isinstance(f, Mapping)]
    if not findings or not findings[0].get("missing"):
        return []
    finding = findings[0]
    trials = finding.get("trials")
    found = f" (in {trials}/{result.get('trials', '?')} trials)" if trials else ""
    lines = [f"race{found}: {finding['missing']}"]
    for side in ("first", "second"):
        op = finding.get(side)
        if not isinstance(op, Mapping):
            continue
        span = op.get("bytes") if isinstance(op.get("bytes"), list) else []
        where = op.get("origin") or op.get("site")
        lines.append(f"  {side}: seq {op.get('seq', '?')} {op.get('stream', '?')} "
                     f"{op.get('kind', '?')} {op.get('access', '?')}"
                     + (f" bytes {span[0]}..{span[1]}" if len(span) == 2 else "")
                     + (f" at {where}" if where else ""))
    if len(findings) > 1:
        lines.append(f"  and {len(findings) - 1} more race(s) in run.json")
    return lines


def _incidents(result: Mapping[str, Any]) -> list[str]:
    return [f"incident: {path}" for path in result.get("reports") or []]


def _figures(result: Mapping[str, Any]) -> str:
    """``"expect reproduces; 3 trials in 0.003 s; manifested 3; race detected 3; delay 1000
    us; min rate 0.9"``: what the variant was asked to do and what it did, in one line."""
    parts = [f"expect {result.get('expect') or '?'}",
             f"{result.get('trials', 0)} trials in {_result_time(result):.3f} s",
             f"manifested {result.get('manifested', 0)}" + (
                 f" (95% interval {interval})" if (interval := percent_interval(
                     result.get("manifested_interval"))) else ""),
             f"race detected {result.get('detected', 0)}"]
    if result.get("delay_us") is not None:
        parts.append(f"delay {_number(result['delay_us'])} us")
    elif result.get("amplified") is False:
        parts.append("not amplified")
    if result.get("min_rate"):
        parts.append(f"min rate {_number(result['min_rate'])}")
    if result.get("dangerous"):
        parts.append("dangerous")
    return "; ".join(parts)


def _system_out(result: Mapping[str, Any], story: bool = True) -> str:
    """What a reader of a test still wants to know: its figures, chiefly partial reproduction;
    with ``story`` (a variant that did not fail: the failure text tells a failed one's) the
    race found and the incident folders too."""
    trials, manifested = result.get("trials") or 0, result.get("manifested") or 0
    detected = result.get("detected") or 0
    lines = [_figures(result)]
    if result.get("expect") == "reproduces" and trials:
        if 0 < manifested < trials:
            lines.append(f"reproduced in {manifested}/{trials} trials")
        elif manifested == trials:
            lines.append(f"reproduced in every trial ({trials})")
        if detected:
            lines.append(f"race detected in {detected}/{trials} trials")
    if trials:
        lines.append("outcomes: " + _outcome_counts(result))
    xids = summarize_xids(result.get("xids"))
    if xids:
        lines.append(f"GPU reported {xids}")
    if story:
        lines += _race(result) + _incidents(result)
    return "\n".join(lines)


def summarize_xids(xids: Any) -> str:
    """``"Xid 43 (application) x3, Xid 79 (gpu-fatal)"`` from a run result's Xid records
    (``{"xid", "class", "trials"}``, as the harness decoded them; bare numbers are accepted and
    shown without a class); ``""`` for none."""
    parts = []
    for entry in xids or []:
        if isinstance(entry, Mapping):
            number, klass, count = entry.get("xid"), entry.get("class"), entry.get("trials", 1)
        else:
            number, klass, count = entry, None, 1
        if number is None:
            continue
        text = f"Xid {number}" + (f" ({klass})" if klass else "")
        parts.append(text + (f" x{count}" if isinstance(count, int) and count > 1 else ""))
    return ", ".join(parts)
