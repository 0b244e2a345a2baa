"""Incidents: what the runner knows about a trial that did not end clean, as a report.

Builds the canonical report dict (schema gpurace.report/1) from the scenario, the trial, the
device, the GPU's health, the Xids seen and the flight recorder's trace, with the exact command
that reproduces it; ``reports`` renders and writes it.
"""

from __future__ import annotations

import datetime as _dt
import shlex
from pathlib import Path
from typing import Any

from harness.errors import TraceError
from harness.traces.optrace import load_trace
from harness.lang.model import Scenario, Variant
from harness.lang.targets import shown_target
from harness.results.outcome import TrialResult

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


def build_report(scenario: Scenario, variant: Variant, trial: TrialResult, *, backend: str,
                 device: dict[str, Any], health: dict[str, Any], run_seed: int,
                 amplification: dict[str, Any] | None, xids: list[dict[str, Any]],
                 xid_note: str, kernel_log: list[str], argv: list[str],
                 env: dict[str, str] | None = None) -> dict[str, Any]:
    """The gpurace.report/1 dict of one incident. ``env``: what the reproduce command must
    run under (the GPU a lane pinned the trial's worker to)."""
    last_ops, buffers, ops_total = trace_tail(trial)
    return {
        "schema": "gpurace.report/1",
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "scenario": {"name": scenario.name, "path": str(scenario.path),
                     "description": scenario.description, "dangerous": scenario.dangerous},
        "variant": {"name": variant.name, "defects": variant.defects.to_json(),
                    "bugs": list(variant.defects.active()), "expect": variant.expect},
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
        "xids": xids,
        "xid_note": xid_note,
        "kernel_log": kernel_log,
        "device_log": trial.device_log,
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
