"""`gpurace run` on the GPU: the acceptance figures of the three seed scenarios (marker gpu)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.lang.targets import SCENARIO_ROOT

pytestmark = pytest.mark.gpu


def _run(tmp_path: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", *args, "--backend", "cuda", "--format", "json",
                                       "--out", str(tmp_path), "--insist"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def _show(doc: dict) -> None:
    for r in doc["results"]:
        print(f"\n{r['scenario']} [{r['variant']}] {r['status']}: {r['manifested']}/"
              f"{r['trials']} manifested, outcomes {r['outcomes']}, delay {r['delay_us']} us"
              + (f", crash requests {r['crash_requests']}" if r["crash_requests"] else ""))


def test_cross_stream_race_on_gpu(tmp_path: Path) -> None:
    code, doc = _run(tmp_path, "cross-stream-race", "--dangerous", "--trials", "200")
    _show(doc)
    by = {r["variant"]: r for r in doc["results"]}
    assert by["buggy"]["manifested"] >= 0.95 * 200
    assert by["fixed"]["manifested"] == 0
    assert code == 0


def test_release_fence_on_gpu(tmp_path: Path) -> None:
    code, doc = _run(tmp_path, "smoke", "--trials", "200")
    _show(doc)
    by = {r["variant"]: r for r in doc["results"]}
    assert by["buggy"]["manifested"] >= 0.95 * 200 and by["fixed"]["manifested"] == 0
    assert code == 0


def test_catalog_reactivation_buggy_asserts_early_and_harness_survives(tmp_path: Path) -> None:
    code, doc = _run(tmp_path, "catalog-reactivation", "--dangerous", "--variant", "buggy",
                     "--trials", "20")
    _show(doc)
    [r] = doc["results"]
    assert r["outcomes"]["crash"] == 20
    assert r["first_manifested"]["cuda_error"] == "CUDA_ERROR_ASSERT"
    early = sum(1 for k in r["crash_requests"] if k <= 3)
    assert early >= 0.95 * 20
    assert code == 0


def test_catalog_reactivation_fixed_survives_10000_requests(tmp_path: Path) -> None:
    code, doc = _run(tmp_path, "catalog-reactivation", "--dangerous", "--variant", "fixed",
                     "--trials", "100")
    _show(doc)
    [r] = doc["results"]
    assert r["outcomes"]["clean"] == 100  # 100 trials x 100 requests
    assert code == 0


def test_hung_worker_killed_gpu_fine_afterwards(tmp_path: Path) -> None:
    hang = tmp_path / "hang.yaml"
    hang.write_text(
        "apiVersion: gpurace/v1\nkind: Scenario\n"
        "metadata: {name: hang, description: a kernel that never ends}\n"
        "spec:\n  pool: {pages: 2}\n  trials: 1\n  timeout: 2\n"
        "  variants: {fixed: {expect: clean}}\n"
        "  steps:\n    - {op: delay, stream: compute, us: .inf}\n    - {op: synchronize}\n")
    started = time.monotonic()
    code, doc = _run(tmp_path, str(hang), str(SCENARIO_ROOT / "release_fence.yaml"),
                     "--trials", "2")
    _show(doc)
    hung, after = doc["results"][0], doc["results"][1:]
    print(f"\nhang: {hung['first_manifested']['detail']}")
    assert hung["first_manifested"]["duration_s"] <= 2 + 2
    print(f"\nhang run took {time.monotonic() - started:.1f} s")
    assert hung["trials"] == 2 and hung["outcomes"]["hang"] == 2
    assert [r["status"] for r in after] == ["pass", "pass"]  # the GPU runs kernels afterwards
    assert code == 1


_PARENT = """
import json, sys
from pathlib import Path
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.targets import resolve_targets

if __name__ == "__main__":
    runner = Runner(RunOptions(backend="cuda", dangerous=True, trials=3, variants=("buggy",),
                               out_dir=Path(sys.argv[1])))
    result = runner.run(resolve_targets(["catalog-reactivation"]))
    maps = open("/proc/self/maps").read()
    [r] = result.results
    print(json.dumps({"libcuda": "libcuda.so" in maps, "libnvidia-ml": "libnvidia-ml" in maps,
                      "cupy": "cupy" in sys.modules, "crashes": r.counts["crash"],
                      "xids": [x["xid"] for x in r.to_json()["xids"]],
                      "health": result.health["before"]["available"]}))
"""


def test_the_parent_of_a_crash_run_loads_no_gpu_library(tmp_path: Path) -> None:
    """Workers and helpers touch the GPU; the parent that supervises them stays plain Python,
    and still gets each crash's Xid (from the NVML helper) and the GPU's health."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    print("\nparent of a crash run:", seen)
    assert seen == {"libcuda": False, "libnvidia-ml": False, "cupy": False, "crashes": 3,
                    "xids": [43], "health": True}
