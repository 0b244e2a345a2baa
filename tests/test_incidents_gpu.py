"""Incident reports on the GPU: Xid 43 through NVML and the kernel log, the worker's pid, the last
ops, and a reproduce command that crashes the same way (marker gpu)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from reports import load_report

pytestmark = pytest.mark.gpu


def _run(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", *args, "--format", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def test_catalog_crash_incident_on_gpu(tmp_path: Path) -> None:
    code, doc = _run("catalog-reactivation", "--dangerous", "--backend", "cuda", "--variant",
                     "buggy", "--trials", "3", "--out", str(tmp_path / "run"), "--insist")
    assert code == 0
    [result] = doc["results"]
    assert result["outcomes"]["crash"] == 3
    report = load_report(Path(result["reports"][0]))
    print("\n" + (Path(result["reports"][0]) / "report.md").read_text())
    assert report["cuda_error"] == "CUDA_ERROR_ASSERT"
    pid = report["trial"]["worker_pid"]
    xids = {x["xid"]: x for x in report["xids"]}
    assert 43 in xids, report["xids"]
    assert "nvml" in xids[43]["sources"], xids[43]
    assert any(f"pid={pid}" in line and ": 43," in line for line in report["kernel_log"])
    assert report["last_ops"] and report["last_ops"][-1]["kind"] == "kernel:read_table"
    assert "kernels.cu:132" in report["device_log"]
    assert report["health"]["before"]["available"]

    argv = shlex.split(report["reproduce"]["command"])
    code, again = _run(*argv[2:], "--out", str(tmp_path / "again"))
    [rerun] = again["results"]
    print(f"reproduce: {report['reproduce']['command']} -> exit {code}, "
          f"{rerun['outcomes']}, first {rerun['first_manifested']['cuda_error']} at request "
          f"{rerun['crash_requests']}")
    assert code == 0 and rerun["outcomes"]["crash"] == 1
    assert rerun["first_manifested"]["cuda_error"] == "CUDA_ERROR_ASSERT"
    assert rerun["crash_requests"] == [report["request"]]
    assert 43 in {x["xid"] for x in rerun["xids"]}
