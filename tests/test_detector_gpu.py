"""The race detector on the GPU: the same findings on cuda as on sim (marker gpu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main

pytestmark = pytest.mark.gpu


def _findings(backend: str, scenario: str, trials: int, tmp: Path) -> dict[str, tuple]:
    result = CliRunner().invoke(main, [
        "run", scenario, "--dangerous", "--no-amplify", "--backend", backend, "--trials",
        str(trials), "--format", "json", "--out", str(tmp / backend), "--insist"])
    doc = json.loads(result.stdout)
    out = {}
    for r in doc["results"]:
        keys = sorted((f["buffer"], f["first"]["stream"], f["first"]["kind"],
                       f["first"]["step"], f["second"]["stream"], f["second"]["kind"],
                       f["second"]["step"]) for f in r["findings"])
        out[r["variant"]] = (r["detected"], r["trials"], keys)
    return out


@pytest.mark.parametrize(("scenario", "trials"), [("release-fence", 50),
                                                  ("cross-stream-race", 50),
                                                  ("catalog-reactivation", 5)])
def test_same_findings_on_cuda_as_on_sim(scenario: str, trials: int, tmp_path: Path) -> None:
    cuda = _findings("cuda", scenario, trials, tmp_path)
    sim = _findings("sim", scenario, trials, tmp_path)
    print(f"\n{scenario}: cuda {cuda}\n{scenario}: sim  {sim}")
    assert cuda == sim
    assert cuda["buggy"][0] == trials and cuda["fixed"][0] == 0
