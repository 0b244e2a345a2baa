"""JUnit XML of a run (``gpurace.run/1``), in the shape GitLab and Jenkins read.

One ``<testsuite>`` per scenario, one ``<testcase>`` per variant (per delay in a sweep). A
variant that broke its expectation is a ``<failure>`` whose message a CI page shows in one
line: the expectation, the outcome counts and the Xids. Each testcase carries its figures and
report paths as ``<property>`` elements.
"""

from __future__ import annotations

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
    totals = _counts(results)
    _set_counts(root, totals, _seconds(run.get("wall_s")) or totals["time"])
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
        "skipped": statuses.count("skip"),
        "errors": statuses.count("error"),
        "time": sum(_result_time(r) for r in results),
    }


def _set_counts(element: ET.Element, counts: Mapping[str, Any], time: float) -> None:
    for key in ("tests", "failures", "errors", "skipped"):
        element.set(key, str(counts[key]))
    element.set("time", f"{time:.3f}")


def _status(result: Mapping[str, Any]) -> str:
    """pass, fail or skip; anything else is an error of the producer, shown as such."""
    status = result.get("status")
    return status if status in ("pass", "fail", "skip") else "error"


def _seconds(value: Any) -> float:
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return 0.0


def _result_time(result: Mapping[str, Any]) -> float:
    return _seconds(result.get("wall_s", result.get("time")))


def _testsuite(scenario: str, results: list[Mapping[str, Any]],
               run: Mapping[str, Any]) -> ET.Element:
    counts = _counts(results)
    suite = ET.Element("testsuite", name=scenario)
    _set_counts(suite, counts, counts["time"])
    device = run.get("device") if isinstance(run.get("device"), Mapping) else {}
    if device.get("name"):
        suite.set("hostname", str(device["name"]))  # the GPU is the "host" a test ran on
    for result in results:
        suite.append(_testcase(scenario, result, run))
    return suite


def _testcase(scenario: str, result: Mapping[str, Any], run: Mapping[str, Any]) -> ET.Element:
    case = ET.Element("testcase", classname=f"gpurace.{scenario}", name=_case_name(result),
                      time=f"{_result_time(result):.3f}")
    if result.get("path"):
        case.set("file", str(result["path"]))
    case.append(_properties(result, run))
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
    out = _system_out(result)
    if out and status != "skip":
        ET.SubElement(case, "system-out").text = out
    return case


def _case_name(result: Mapping[str, Any]) -> str:
    name = str(result.get("variant", "?"))
    if result.get("sweep"):
        name += f"@{_number(result.get('delay_us'))}us"
    return name


def _number(value: Any) -> str:
    """1000.0 as "1000", 2.5 as "2.5": test names must not change with float formatting."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


def _properties(result: Mapping[str, Any], run: Mapping[str, Any]) -> ET.Element:
    props = ET.Element("properties")
    figures = [("expect", result.get("expect")), ("trials", result.get("trials")),
               ("manifested", result.get("manifested")), ("detected", result.get("detected")),
               ("delay_us", result.get("delay_us")), ("min_rate", result.get("min_rate")),
               ("dangerous", result.get("dangerous")), ("backend", run.get("backend")),
               ("seed", run.get("seed"))]
    for name, value in figures:
        if value is not None:
            ET.SubElement(props, "property", name=name, value=_value(value))
    for path in result.get("reports") or []:
        ET.SubElement(props, "property", name="report", value=str(path))
    return props


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
    lines = []
    if result.get("reason"):
        lines.append(str(result["reason"]))
    first = result.get("first_manifested")
    if isinstance(first, Mapping):
        lines.append(_first_trial(first))
    if result.get("crash_requests"):
        requests = ", ".join(str(r) for r in result["crash_requests"])
        lines.append(f"crashed at request(s): {requests}")
    lines += [f"report: {path}" for path in result.get("reports") or []]
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


def _system_out(result: Mapping[str, Any]) -> str:
    """What a reader of a passing test still wants to know, chiefly partial reproduction."""
    trials, manifested = result.get("trials") or 0, result.get("manifested") or 0
    detected = result.get("detected") or 0
    lines = []
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
