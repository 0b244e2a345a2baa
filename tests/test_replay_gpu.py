"""Ticket replay on the GPU: ninfer-210 with #210's defect crashes early; without it, the whole
ticket completes (marker gpu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.lang.targets import SCENARIO_ROOT

pytestmark = pytest.mark.gpu

TICKET = str(SCENARIO_ROOT / "tickets" / "ninfer-210.jsonl")


def _replay(tmp_path: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["replay", TICKET, *args, "--backend", "cuda",
                                       "--format", "json", "--out", str(tmp_path), "--insist"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def test_ninfer_210_with_the_defect_amplified_crashes_within_3_requests(tmp_path: Path) -> None:
    code, doc = _replay(tmp_path, "--defect", "publish_on_legacy_stream", "--dangerous",
                        "--trials", "20")
    [r] = doc["results"]
    early = sum(1 for k in r["crash_requests"] if k <= 3)
    print(f"\nninfer-210 amplified: {r['outcomes']}, crash requests {r['crash_requests']}")
    assert r["outcomes"]["crash"] == 20 and early >= 0.95 * 20
    assert r["first_manifested"]["cuda_error"] == "CUDA_ERROR_ASSERT" and code == 0


def test_ninfer_210_with_the_defect_unamplified(tmp_path: Path) -> None:
    _, doc = _replay(tmp_path, "--defect", "publish_on_legacy_stream", "--dangerous",
                     "--no-amplify", "--trials", "5")
    [r] = doc["results"]
    print(f"\nninfer-210 unamplified: {r['outcomes']}, crash requests {r['crash_requests']}, "
          f"detected {r['detected']}/{r['trials']}")
    assert r["detected"] == 5  # found whether or not it crashed


def test_ninfer_210_without_the_defect_completes(tmp_path: Path) -> None:
    code, doc = _replay(tmp_path, "--trials", "2")
    [r] = doc["results"]
    print(f"\nninfer-210 fixed: {r['outcomes']}")
    assert r["outcomes"]["clean"] == 2 and r["detected"] == 0 and code == 0
