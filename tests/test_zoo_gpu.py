"""The zoo on the GPU (marker gpu): every buggy variant found on trial 1 without amplification
and manifesting amplified, every fixed variant clean and race-free, the same findings as on the
simulated device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.targets import SCENARIO_ROOT
from harness.scenario import load_scenario

pytestmark = pytest.mark.gpu

ZOO = sorted((SCENARIO_ROOT / "zoo").glob("*.yaml"))
CLEAN = sorted({v.name for p in ZOO for v in load_scenario(p).variants if v.expect == "clean"})


def _run(tmp: Path, backend: str, *args: str) -> dict[str, dict]:
    result = CliRunner().invoke(main, ["run", "zoo", "--dangerous", "--insist", "--backend",
                                       backend, "--format", "json", "--out", str(tmp), *args])
    assert result.exit_code in (0, 1), result.output
    return {f"{r['scenario']}/{r['variant']}": r for r in json.loads(result.stdout)["results"]}


def _keys(r: dict) -> list[tuple]:
    return sorted((f["buffer"], f["owner"], f["first"]["stream"], f["first"]["kind"],
                   f["first"]["step"], f["second"]["stream"], f["second"]["kind"],
                   f["second"]["step"]) for f in r["findings"])


def test_the_zoo_on_the_gpu(tmp_path: Path) -> None:
    unamplified = _run(tmp_path / "unamp", "cuda", "--no-amplify", "--trials", "5",
                       "--variant", "buggy")
    on_sim = _run(tmp_path / "sim", "sim", "--no-amplify", "--trials", "1", "--variant", "buggy")
    amplified = _run(tmp_path / "amp", "cuda", "--trials", "50", "--variant", "buggy")
    clean = _run(tmp_path / "clean", "cuda", "--trials", "100",
                 *[a for name in CLEAN for a in ("--variant", name)])
    print("\nscenario           | unamplified: detected, manifested | amplified | clean "
          "variants: manifested, detected")
    failures = []
    for path in ZOO:
        scenario = load_scenario(path)
        name = scenario.name
        u, a = unamplified[f"{name}/buggy"], amplified[f"{name}/buggy"]
        cleans = [clean[f"{name}/{v.name}"] for v in scenario.variants if v.expect == "clean"]
        print(f"{name:18} | {u['detected']}/{u['trials']}, {u['manifested']}/{u['trials']} | "
              f"{a['manifested']}/{a['trials']} | " + ", ".join(
                  f"{c['variant']} {c['manifested']}/{c['trials']} {c['detected']}"
                  for c in cleans))
        if u["detected"] != u["trials"] or a["manifested"] < 0.95 * a["trials"]:
            failures.append(name)
        if any(c["manifested"] or c["detected"] or c["trials"] != 100 for c in cleans):
            failures.append(f"{name} (clean)")
        if _keys(u) != _keys(on_sim[f"{name}/buggy"]):
            failures.append(f"{name} (findings differ from sim)")
    assert not failures, failures
