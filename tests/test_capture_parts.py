"""Where the capture's time goes, by part: a profile's functions taken apart
(harness.capture.parts), and tests/real_programs/parts.py on a program of the CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.capture import parts as P
from tests.frameworks import python_with

ROOT = Path(__file__).resolve().parent.parent


def _stat(tottime: float, calls: int = 1) -> tuple[int, int, float, float, dict]:
    return (calls, calls, tottime, tottime, {})


def test_each_function_goes_to_its_part_and_the_programs_to_none():
    capture = "/x/site-packages/harness/capture/"
    stats = {
        (capture + "torch_source.py", 160, "__torch_dispatch__"): _stat(0.010, 100),
        (capture + "torch_capture.py", 238, "before"): _stat(0.020, 100),
        (capture + "torch_capture.py", 486, "on_free"): _stat(0.004, 40),
        (capture + "torch_capture.py", 90, "name_pending"): _stat(0.003, 10),
        (capture + "torch_capture.py", 160, "plan"): _stat(0.001, 100),
        (capture + "sites.py", 85, "program_frame"): _stat(0.005, 140),
        (capture + "sites.py", 162, "variable_for"): _stat(0.002, 10),
        (capture + "torch_ops.py", 168, "byte_spans"): _stat(0.006, 200),
        (capture + "events.py", 115, "emit"): _stat(0.007, 100),
        (capture + "torch_collectives.py", 40, "dispatch"): _stat(0.001, 2),
        (capture + "opcost.py", 77, "<lambda>"): _stat(0.050, 100),  # the measured loop
        ("/x/site-packages/harness/run/worker.py", 1, "run"): _stat(0.001),
        ("/x/site-packages/torch/utils/_python_dispatch.py", 1, "f"): _stat(0.002, 100),
        ("/x/site-packages/torch/nn/modules/linear.py", 1, "forward"): _stat(0.100, 100),
        ("/home/me/train.py", 10, "main"): _stat(1.000),
        ("~", 0, "<built-in method builtins.len>"): _stat(0.300, 9999),
    }
    got = {p.part: (round(p.own_s, 6), p.calls) for p in P.split(stats)}
    assert got == {
        P.MODE: (0.011, 200),
        P.TENSORS: (0.026, 300),
        P.LINE: (0.005, 140),
        P.NAMING: (0.005, 20),
        P.CALLBACKS: (0.004, 40),
        P.SINK: (0.007, 100),
        P.LIBRARIES: (0.001, 2),
        P.OTHER: (0.001, 1),
        P.PYTORCH: (0.002, 100),
    }
    assert [p.part for p in P.split(stats)] == list(P.ORDER)
    shown = P.table(P.split(stats), ops=100, total_s=1.5)
    # gpurace's own: 0.060 s of the capture's parts (PyTorch's mode dispatch apart).
    assert "| the program's line (stack walk) | 5.0 | 50.00 | 8% |" in shown
    assert "| PyTorch's Python dispatch for a mode | 2.0 | 20.00 | - |" in shown
    assert "100 ops captured; gpurace's own 60.0 ms of 1,500.0 ms" in shown


TORCH_PYTHON = python_with("torch")


@pytest.mark.skipif(TORCH_PYTHON is None,
                    reason="no interpreter with PyTorch here (GPURACE_TEST_PYTHON)")
def test_parts_of_a_watched_program_come_from_its_own_profile(tmp_path):
    (tmp_path / "corpus.py").write_text(
        "from typing import NamedTuple\n"
        "class Entry(NamedTuple):\n"
        "    name: str\n    script: str\n    args: tuple\n    needs: tuple\n"
        "    library: str\n    expect: str = 'clean'\n"
        "CORPUS = (Entry('loop', 'loop.py', (), ('torch',), 'torch'),)\n")
    (tmp_path / "loop.py").write_text(
        "import torch\nx = torch.ones(64)\nfor _ in range(500):\n    y = x * 2 + 1\n"
        "print(float(y.sum()))\n")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "real_programs" / "parts.py"),
                           "--only", "loop", "--python", TORCH_PYTHON,
                           "--corpus", str(tmp_path / "corpus.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.startswith("## loop\n"), out
    # Two ops a pass (mul, add), 500 passes, and the ones before: all of them counted.
    ops = int(out.split(" ops captured")[0].rsplit("\n", 1)[-1].replace(",", ""))
    assert ops >= 1000, out
    assert f"| {P.MODE} |" in out and f"| {P.TENSORS} |" in out, out
