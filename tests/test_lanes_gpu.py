"""`--gpus all` on a host of several GPUs: a crash soak spread over every GPU, each crash's
incident and Xid naming the GPU it happened on, and every GPU healthy after (marker gpu; skipped
where CUDA shows fewer than two GPUs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.gpu.nvml import health_snapshot, visible_gpus
from harness.gpu.probe import gpu_count

pytestmark = pytest.mark.gpu

TRIALS = 24


def test_crashes_on_every_gpu_are_each_put_down_to_their_own(tmp_path: Path) -> None:
    """Every crash's incident names the GPU its worker ran on, and its Xid agrees: NVML's by
    the GPU's index, the kernel's line by the worker's pid and the GPU's PCI bus id; its
    reproduce command pins that GPU."""
    if gpu_count() < 2:
        pytest.skip("needs two GPUs (e.g. the nvidia-h200-x2 kind)")
    result = CliRunner().invoke(main, [
        "run", "catalog-reactivation", "--dangerous", "--variant", "buggy", "--insist",
        "--trials", str(TRIALS), "--gpus", "all", "--max-incidents", str(TRIALS),
        "--backend", "cuda", "--format", "json", "--out", str(tmp_path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    doc = json.loads(result.stdout)
    [r] = doc["results"]
    uuid_of = {i: health_snapshot(index=i)["uuid"] for i in visible_gpus()}
    print(f"\nlanes {doc['lanes']}, outcomes {r['outcomes']}, xids "
          f"{[(x['xid'], x['trials']) for x in r['xids']]}, retired {doc['retired']}")
    assert result.exit_code == 0 and doc["retired"] == []
    assert len(doc["lanes"]) == len(uuid_of) >= 2
    assert r["outcomes"]["crash"] == TRIALS and len(r["reports"]) == TRIALS
    used: dict[str, int] = {}
    for folder in r["reports"]:
        report = json.loads((Path(folder) / "report.json").read_text())
        gpu = report["device"]["uuid"]
        used[gpu] = used.get(gpu, 0) + 1
        assert gpu in uuid_of.values()
        # Its reproduce command runs on that GPU.
        assert report["reproduce"]["env"] == {"CUDA_VISIBLE_DEVICES": gpu}, folder
        assert report["xids"], f"{folder}: no Xid"
        for xid in report["xids"]:
            assert xid["xid"] == 43
            assert xid["pid"] == report["trial"]["worker_pid"]
            if xid["gpu"] is not None:
                assert uuid_of[xid["gpu"]] == gpu, (folder, xid)
            if xid["line"]:
                assert report["device"]["pci_bus_id"].lower() in xid["line"].lower(), xid
    print(f"incidents per GPU: {used}")
    assert len(used) == len(uuid_of)  # the trials went to every GPU
    assert all(health_snapshot(index=i)["available"] for i in uuid_of)
    # Healthy means it still runs: the fixed variant, clean, on every GPU.
    after = CliRunner().invoke(main, [
        "run", "catalog-reactivation", "--dangerous", "--variant", "fixed", "--trials", "8",
        "--gpus", "all", "--backend", "cuda", "--format", "json", "--out", str(tmp_path)])
    [fixed] = json.loads(after.stdout)["results"]
    assert after.exit_code == 0 and fixed["outcomes"]["clean"] == 8, after.output
