"""Incidents: what is known about a trial that did not end clean, as a report.

Builds the canonical report dict (schema gpurace.report/1) from what the trial was of (a
scenario's variant, or a watched program), the trial, the device, the GPU's health, the Xids
seen and the trace, with the exact command that reproduces it; ``reports`` renders and writes
it. `gpurace run` and `gpurace watch` both write their incidents through here.
"""

from __future__ import annotations

import datetime as _dt
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import TraceError
from harness.traces.optrace import load_trace, plain_file
from harness.lang.model import Scenario, Variant
from harness.lang.targets import shown_target
from harness.results.outcome import TrialResult
from reports import write_incident

LAST_OPS = 300
"""How many of the last op records an incident report carries (the whole trace is beside it)."""


def reproduce_argv(scenario: Scenario, variant: Variant, trial: TrialResult, *, backend: str,
                   run_seed: int, amplified: bool, delay_us: float | None,
                   delay_overridden: bool, timeout_s: float | None,
                   schedule: str | None = None, poison: bool = False) -> list[str]:
    """The gpurace command line that runs exactly this trial again."""
    shown = shown_target(scenario.path, scenario.name)
    if scenario.replay_defects is not None:
        argv = ["gpurace", "replay", shown, "--backend", backend]
        for defect in scenario.replay_defects:
            argv += ["--defect", defect]
    else:
        argv = ["gpurace", "run", shown, "--backend", backend, "--variant", variant.name]
    argv += ["--seed", str(run_seed), "--trial", str(trial.index)]
    if scenario.dangerous:
        argv.append("--dangerous")
    if not amplified:
        argv.append("--no-amplify")
    elif delay_overridden and delay_us is not None:
        argv += ["--delay-us", f"{delay_us:g}"]
    if timeout_s is not None:
        argv += ["--timeout", f"{timeout_s:g}"]
    if schedule is not None:
        argv += ["--schedule", schedule]
    if poison:
        argv.append("--poison")
    return argv


def trace_tail(trial: TrialResult) -> tuple[list[dict[str, Any]], dict[str, str], int]:
    """A trial's last ops as a report carries them, the names of the buffers they name (by
    id), and how many ops it had; nothing of its trace when that cannot be read."""
    if not trial.trace or not Path(trial.trace).exists():
        return [], {}, trial.ops_total
    try:
        trace = load_trace(Path(trial.trace))
    except TraceError:
        return [], {}, trial.ops_total  # the report still stands without its last ops
    ops = trace.ops
    last = [{k: v for k, v in op.items() if k != "type"} for op in ops[-LAST_OPS:]]
    used = {a[0] for op in last for a in (*op.get("reads", ()), *op.get("writes", ()))}
    names = {str(r["id"]): str(r["name"]) for r in trace.records
             if r["type"] == "buffer" and r["id"] in used}
    return last, names, max(trial.ops_total, len(ops))


@dataclass(frozen=True)
class Subject:
    """What an incident is of: a scenario's variant, or a watched program (which has no pool
    settings, so no defects and no bugs)."""

    name: str
    path: str
    description: str
    dangerous: bool
    variant: str
    expect: str
    defects: dict[str, Any] | None = None  # a scenario's pool settings; None for a program
    bugs: tuple[str, ...] = ()

    @classmethod
    def of_scenario(cls, scenario: Scenario, variant: Variant) -> Subject:
        return cls(scenario.name, str(scenario.path), scenario.description, scenario.dangerous,
                   variant.name, variant.expect, variant.defects.to_json(),
                   tuple(variant.defects.active()))

    def scenario_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "description": self.description,
                "dangerous": self.dangerous}

    def variant_json(self) -> dict[str, Any]:
        if self.defects is None:
            return {"name": self.variant, "expect": self.expect}
        return {"name": self.variant, "defects": self.defects, "bugs": list(self.bugs),
                "expect": self.expect}


def build_report(subject: Subject, trial: TrialResult, *, backend: str,
                 device: dict[str, Any], health: dict[str, Any], run_seed: int,
                 amplification: dict[str, Any] | None, argv: list[str],
                 env: dict[str, str] | None = None, xids: Sequence[dict[str, Any]] = (),
                 xid_note: str = "", kernel_log: Sequence[str] = (),
                 device_log: str | None = None) -> dict[str, Any]:
    """The gpurace.report/1 dict of one incident. ``env``: what the reproduce command must
    run under (the GPU a lane pinned the trial's worker to). ``device_log``: what the device
    or the program said as it ended, where the trial's own is not it (a watched program's
    traceback)."""
    last_ops, buffers, ops_total = trace_tail(trial)
    return {
        "schema": "gpurace.report/1",
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "scenario": subject.scenario_json(),
        "variant": subject.variant_json(),
        "trial": {"index": trial.index, "seed": trial.seed,
                  "duration_s": round(trial.duration_s, 4), "worker_pid": trial.worker_pid},
        "run_seed": run_seed,
        "backend": backend,
        "device": device,
        "health": health,
        "outcome": trial.outcome.value,
        "detail": trial.detail,
        "cuda_error": trial.cuda_error,
        "step": trial.step,
        "request": trial.requests if trial.outcome.value == "crash" else None,
        "xids": list(xids),
        "xid_note": xid_note,
        "kernel_log": list(kernel_log),
        "device_log": trial.device_log if device_log is None else device_log,
        "amplification": amplification,
        "findings": trial.findings,
        "last_ops": last_ops,
        "buffers": buffers,
        "ops_total": ops_total,
        "trace": "trace.jsonl",
        "reproduce": {"command": shlex.join(argv), "argv": argv} if not env else {
            "command": " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " "
            + shlex.join(argv), "argv": argv, "env": env},
    }


def write_report(folder: Path, report: dict[str, Any], trial: TrialResult,
                 extra: Mapping[str, str | Path]) -> Path:
    """The incident folder of ``report`` under ``folder``, with the trial's trace beside it
    and the ``extra`` files (logs). A trace's reissued runs are written out as op lines: the
    incident's trace is for people and other tools too."""
    trace = plain_file(Path(trial.trace)) if trial.trace else None
    return write_incident(folder, report, trace, extra)
