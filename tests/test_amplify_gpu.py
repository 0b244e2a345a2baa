"""`gpurace watch --amplify` on the real programs, on a GPU: the delay before each buggy
program's racing op makes its answer wrong in at least 95% of its runs, and the same delays,
queued before the same lines of its fixed twin, never do; and `gpurace minimize` of each
buggy program's incident is a scenario that reproduces amplified on the GPU and is clean fixed.

GPURACE_AMPLIFY_TRIALS sets the runs per program and twin (50 by default, as the acceptance
asks; fewer for a quick look).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.test_watch_gpu import PROGRAMS, ROOT, _framework_ok

TRIALS = int(os.environ.get("GPURACE_AMPLIFY_TRIALS", "50"))
MOVED = {"tests/watch_programs/torch_legacy_publish.py:74":
         "tests/watch_programs/torch_legacy_publish.py:78"}
"""Racing ops that the fix issues from another line: torch_legacy_publish's fix publishes the
row on the reader's stream, the same copy from line 78, and the fixed twin's delay goes there."""

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _framework_ok(), reason="needs PyTorch and CuPy on a GPU")]


def _watch(out: Path, options: list[str], command: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--format", "json", "--out", str(out),
         "--trials", str(TRIALS), "--fails-when", "^WRONG", *options, "--", *command],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=3000)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"exit {done.returncode}: {done.stderr[-3000:]}") from None
    doc["_exit"] = done.returncode
    return doc


def _row(name: str, buggy: dict, fixed: dict) -> str:
    """One program's line of the table: its best pair's failures, its twin's, the run cost."""
    entries = buggy["watch"]["amplified"]
    best = max(entries, key=lambda a: a["failed"], default=None)
    runs = len(buggy["watch"]["runs"]) + len(fixed.get("watch", {}).get("runs", []))
    wall = buggy["wall_s"] + fixed.get("wall_s", 0.0)
    fixed_cells = ", ".join(f"{a['failed']}/{a['trials']} {a['queued']}"
                            for a in fixed.get("watch", {}).get("amplified", []))
    cell = f"{best['failed']}/{best['trials']} {best['interval']}" if best else "none"
    return (f"{name:22} | {len(entries):5} | {cell:29} | {fixed_cells:27} | "
            f"{wall / max(runs, 1):.2f}")


@pytest.fixture(scope="module")
def amplified(tmp_path_factory) -> dict[str, tuple[dict, dict, dict]]:
    """Each program's buggy run with --amplify auto, its fixed twin with the delays auto
    planned for the buggy one (the same lines), and the scenario `gpurace minimize` makes of
    the buggy run's incident, run on the GPU; programs side by side."""
    out = tmp_path_factory.mktemp("amplify")

    def one(prog: Path) -> tuple[str, tuple[dict, dict, dict]]:
        command = [sys.executable, str(prog.relative_to(ROOT))]
        buggy = _watch(out / f"{prog.stem}-buggy", ["--amplify", "auto"], command)
        sites = sorted({MOVED.get(site, site) for site in (
            f"{d['path']}:{d['line']}" for a in buggy["watch"]["amplified"] for d in a["delays"])})
        words = [w for site in sites for w in ("--amplify", site)]
        fixed = _watch(out / f"{prog.stem}-fixed", words, [*command, "--fixed"]) if sites \
            else {}
        print(_row(prog.stem, buggy, fixed), flush=True)
        return prog.stem, (buggy, fixed, _shrunk(prog.stem, buggy, out))

    print("\nprogram                | pairs | buggy failed (best pair), 95% | fixed failed, "
          "delays queued | s per run", flush=True)
    with ThreadPoolExecutor(max_workers=12) as pool:
        found = dict(pool.map(one, PROGRAMS))
    return found


def test_each_buggy_program_fails_amplified(amplified):
    failures = []
    for name, (buggy, _, _) in amplified.items():
        entries = buggy["watch"]["amplified"]
        if not entries:
            failures.append(f"{name}: nothing planned ({buggy['watch_notes']})")
            continue
        best = max(entries, key=lambda a: a["failed"])
        if best["failed"] < 0.95 * best["trials"] or best["queued"] < best["trials"]:
            failures.append(f"{name}: {best}")
    assert not failures, failures


def test_each_fixed_twin_stays_right_under_the_same_delays(amplified):
    failures = []
    for name, (_, fixed, _) in amplified.items():
        if not fixed:
            continue  # reported by the buggy test
        for entry, result in zip(fixed["watch"]["amplified"], fixed["results"]):
            # The delays ran (a fixed twin that queued none would prove nothing) and the
            # answers stayed right, with no race found.
            if entry["failed"] or entry["queued"] < entry["trials"] or result["detected"]:
                failures.append(f"{name}: {entry}, detected {result['detected']}")
    assert not failures, failures


def _shrunk(name: str, buggy: dict, out: Path) -> dict:
    """`gpurace minimize` of the plain run's incident, then `gpurace run` of the scenario on the
    GPU: its steps and each variant's result, or why there is none (``error``)."""
    watched = next(r for r in buggy["results"] if r["variant"] == "watched")
    if not watched["reports"]:
        return {"error": "no incident"}
    scenario = out / f"{name}.yaml"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    made = subprocess.run([sys.executable, "-m", "harness.cli", "minimize",
                           watched["reports"][0], "-o", str(scenario)], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    if made.returncode:
        return {"error": f"minimize exit {made.returncode}: {made.stderr[-500:]}"}
    ran = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(scenario),
                          "--backend", "cuda", "--trials", str(TRIALS), "--format", "json",
                          "--out", str(out / f"{name}-run")], capture_output=True, text=True,
                         cwd=ROOT, env=env)
    try:
        results = {r["variant"]: r for r in json.loads(ran.stdout)["results"]}
    except ValueError:
        return {"error": f"run exit {ran.returncode}: {ran.stderr[-500:]}"}
    return {"steps": scenario.read_text().count("\n    - {"), **results}


def test_each_buggy_programs_incident_shrinks_to_a_scenario_that_reproduces_on_the_gpu(
        amplified):
    """`gpurace minimize` of the plain run's incident: a scenario that reproduces amplified in
    at least 95% of its trials on the GPU, and is clean fixed."""
    failures, rows = [], []
    for name, (_, _, shrunk) in sorted(amplified.items()):
        if "error" in shrunk:
            failures.append(f"{name}: {shrunk['error']}")
            continue
        b, f = shrunk["buggy"], shrunk["fixed"]
        rows.append(f"{name:22} | {shrunk['steps']:5} | {b['manifested']}/{b['trials']} | "
                    f"{f['manifested']}/{f['trials']} {f['detected']}")
        if b["manifested"] < 0.95 * b["trials"] or f["manifested"] or f["detected"]:
            failures.append(f"{name}: buggy {b['manifested']}/{b['trials']}, fixed "
                            f"{f['manifested']}/{f['trials']} detected {f['detected']}")
    print("\nprogram                | steps | scenario amplified | fixed, detected\n"
          + "\n".join(rows))
    assert not failures, failures
