"""The zoo and the seed scenarios on the GPU (marker gpu): every buggy variant found without
amplification and manifesting amplified, every fixed variant clean and race-free, the same
findings and (within 10 points) the same manifestation rates as on the simulated device."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.lang.targets import SCENARIO_ROOT
from harness.lang.scenario import load_scenario

pytestmark = pytest.mark.gpu

ZOO = sorted((SCENARIO_ROOT / "zoo").glob("*.yaml"))
CLEAN = sorted({v.name for p in ZOO for v in load_scenario(p).variants if v.expect == "clean"})


SEED = [SCENARIO_ROOT / name for name in ("release_fence.yaml", "cross_stream_race.yaml",
                                          "stale_row_write.yaml", "store_before_write.yaml")]
CRASHING = SCENARIO_ROOT / "catalog_reactivation.yaml"  # a crash costs a worker: fewer trials


def _run(tmp: Path, backend: str, *args: str, targets: tuple[str, ...] = ("zoo",)
         ) -> dict[str, dict]:
    result = CliRunner().invoke(main, ["run", *targets, "--dangerous", "--insist", "--backend",
                                       backend, "--format", "json", "--out", str(tmp), *args])
    assert result.exit_code in (0, 1), result.output
    return {f"{r['scenario']}/{r['variant']}": r for r in json.loads(result.stdout)["results"]}


def _keys(r: dict) -> list[tuple]:
    return sorted((f["buffer"], f["owner"], f["first"]["stream"], f["first"]["kind"],
                   f["first"]["step"], f["second"]["stream"], f["second"]["kind"],
                   f["second"]["step"]) for f in r["findings"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    """Every buggy variant of the zoo and the seed scenarios, on both backends, amplified and
    not; the zoo's clean variants on the GPU; the zoo's first unamplified trial on sim."""
    tmp = tmp_path_factory.mktemp("runs")
    seed = tuple(str(p) for p in SEED)
    out: dict[str, dict[str, dict]] = {}
    for backend in ("cuda", "sim"):
        for mode, extra in (("unamp", ("--no-amplify",)), ("amp", ())):
            key = f"{backend}-{mode}"
            out[key] = _run(tmp / key, backend, *extra, "--trials", "50", "--variant", "buggy",
                            targets=("zoo", *seed))
            out[key] |= _run(tmp / f"{key}-crash", backend, *extra, "--trials", "10",
                             "--variant", "buggy", targets=(str(CRASHING),))
    out["sim-first"] = _run(tmp / "first", "sim", "--no-amplify", "--trials", "1",
                            "--variant", "buggy")
    out["clean"] = _run(tmp / "clean", "cuda", "--trials", "100",
                        *[a for name in CLEAN for a in ("--variant", name)])
    return out


def _rate(r: dict, what: str = "manifested") -> float:
    return r[what] / r["trials"]


def _same_rate(a: dict, b: dict, what: str) -> bool:
    """Whether two runs' rates could be one rate: within 10 points, or within three standard
    errors of the difference of two binomial rates (pooled). Where real threads pick the
    interleaving, each trial is a coin toss: at about one half in 50 trials a rate moves by 7
    points from run to run, and a bare 10-point bound would fail a third of the runs of two
    backends that agree."""
    hits, trials = a[what] + b[what], a["trials"] + b["trials"]
    p = hits / trials
    stderr = math.sqrt(p * (1 - p) * (1 / a["trials"] + 1 / b["trials"]))
    return abs(_rate(a, what) - _rate(b, what)) <= max(0.10, 3 * stderr)


def test_the_zoo_on_the_gpu(runs: dict[str, dict[str, dict]]) -> None:
    """Found without amplification on every trial (where the race lies between host threads,
    as often as on sim: real threads pick their own interleaving), manifesting amplified, fixed
    variants clean and race-free, the same findings as on sim."""
    print("\nscenario           | unamplified: detected, manifested | amplified | clean "
          "variants: manifested, detected")
    failures = []
    for path in ZOO:
        scenario = load_scenario(path)
        name = scenario.name
        u, a = runs["cuda-unamp"][f"{name}/buggy"], runs["cuda-amp"][f"{name}/buggy"]
        cleans = [runs["clean"][f"{name}/{v.name}"] for v in scenario.variants
                  if v.expect == "clean"]
        print(f"{name:18} | {u['detected']}/{u['trials']}, {u['manifested']}/{u['trials']} | "
              f"{a['manifested']}/{a['trials']} | " + ", ".join(
                  f"{c['variant']} {c['manifested']}/{c['trials']} {c['detected']}"
                  for c in cleans))
        if "threads" in scenario.tags:
            on_sim = runs["sim-unamp"][f"{name}/buggy"]
            if not _same_rate(u, on_sim, "detected"):
                failures.append(f"{name} (detected {u['detected']} against "
                                f"{on_sim['detected']} on sim)")
        elif u["detected"] != u["trials"]:
            failures.append(f"{name} (not detected every trial)")
        if a["manifested"] < 0.95 * a["trials"]:
            failures.append(f"{name} (amplified)")
        if any(c["manifested"] or c["detected"] or c["trials"] != 100 for c in cleans):
            failures.append(f"{name} (clean)")
        first = runs["sim-first"][f"{name}/buggy"]
        if "interleaving" not in scenario.tags and _keys(u) != _keys(first):
            failures.append(f"{name} (findings differ from sim)")
    assert not failures, failures


def test_the_simulated_device_predicts_the_gpu(runs: dict[str, dict[str, dict]]) -> None:
    """Manifestation rates on sim and on the GPU that could be one rate (within 10 points, or
    three standard errors: a race at the edge of its window is a coin toss on the GPU, as a
    kernel of 20 us against the next step's copy is in reissued trials), amplified and
    unamplified, for every buggy variant of the zoo and the seed scenarios; the store that reads
    before the compute stream wrote (the same bytes every trial) manifests amplified on both."""
    print("\nscenario             | unamplified: sim, cuda | amplified: sim, cuda")
    failures = []
    for key in sorted(runs["cuda-amp"]):
        cells = []
        for mode in ("unamp", "amp"):
            sim, cuda = runs[f"sim-{mode}"][key], runs[f"cuda-{mode}"][key]
            cells.append(f"{sim['manifested']}/{sim['trials']}, "
                         f"{cuda['manifested']}/{cuda['trials']}")
            if not _same_rate(sim, cuda, "manifested"):
                failures.append(f"{key} {mode}: sim {_rate(sim):.0%}, cuda {_rate(cuda):.0%}")
        print(f"{key.split('/')[0]:20} | {cells[0]:22} | {cells[1]}")
    for backend in ("sim", "cuda"):
        store = runs[f"{backend}-amp"]["store-before-write/buggy"]
        assert _rate(store) >= 0.95, (backend, store)
    assert not failures, failures
