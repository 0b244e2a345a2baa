"""PyTorch's own op and module databases (tests/op_sweep.py) and transformers' models
(tests/hf_sweep.py), run bare and watched on the CPU: the capture changes no op's result or
arguments, and says every byte each op writes in its arguments (a module's: its parameters
and buffers).

These need an interpreter with PyTorch and expecttest (which PyTorch's test database imports):
this one, or GPURACE_TEST_PYTHON. CI has neither, and skips them. On a GPU (`make test-gpu-core`)
the sweep runs on CUDA tensors too, where each op must also be said on a stream, never as the
host's own.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.frameworks import python_with

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "tests" / "op_sweep.py"
PYTHON = python_with("torch.testing._internal.common_methods_invocations")
pytestmark = pytest.mark.skipif(
    PYTHON is None, reason="no interpreter with PyTorch and expecttest here (GPURACE_TEST_PYTHON)")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PYTHON), *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)


@pytest.mark.parametrize("how", [(), ("--grad",), ("--inference",), ("--modules",),
                                 ("--hops",)],
                         ids=["ops", "ops-with-backward", "ops-in-inference-mode", "modules",
                              "higher-order-ops"])
def test_every_entry_of_the_database_runs_the_same_and_says_its_writes(how):
    # With grad, autograd runs each op's backward too: other kernels, and ops that reach the
    # mode whole though they have a decomposition (silu_backward, native_batch_norm). Under
    # inference_mode composite ops reach it whole (matmul, batch_norm). The modules train
    # (forward, backward, an SGD step) and run in eval mode. The higher-order ops (torch.cond,
    # scan, flex_attention, ...) raised in the program under the capture's mode until it said
    # it takes them.
    done = _run(str(SWEEP), "--samples", "1", *how)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # The whole database ran (the ops with the _foreach_ ones), many in more than one form;
    # the higher-order ops' database is small, and some of its entries have no CPU sample.
    entries, runs = int(summary.split()[0]), int(summary.split(", ")[1].split()[0])
    least = {("--modules",): 100, ("--hops",): 10}.get(how, 700)
    assert entries > least and runs > (entries // 2 if how == ("--hops",) else entries), summary
    # PyTorch's linear algebra takes other paths under any dispatch mode (PyTorch's own
    # pass-through one too, which the sweep runs to tell): said, and no problem of the capture.
    assert _only_any_mode(summary), summary
    said = [line for line in done.stdout.splitlines() if line.startswith("any mode: ")]
    assert all(line.split()[2].startswith("linalg.") for line in said), said


HF_PYTHON = python_with("transformers")


@pytest.mark.skipif(HF_PYTHON is None, reason="no interpreter with transformers here")
def test_language_models_build_generate_and_train_the_same_watched():
    # tests/hf_sweep.py on a few architectures: before the capture ran composite ops as
    # PyTorch runs them, each one's generate under inference_mode gave other logits.
    done = subprocess.run([str(HF_PYTHON), str(ROOT / "tests" / "hf_sweep.py"),
                           "--types", "llama,gpt2,mistral,bert"], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=600)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert summary.startswith("4 model types: 4 ok;") and summary.endswith("no problem"), summary


def _has_cuda() -> bool:
    return PYTHON is not None and subprocess.run(
        [PYTHON, "-c", "import torch; assert torch.cuda.is_available()"],
        capture_output=True).returncode == 0


def _only_any_mode(summary: str) -> bool:
    """Whether the sweep's summary line says no problem, or only differences that PyTorch's own
    pass-through mode makes too."""
    kinds = {part.split(" ", 1)[1] for part in summary.split("; ", 1)[1].split(", ")}
    return summary.endswith("no problem") or kinds <= {"any mode"}


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs PyTorch on a CUDA GPU")
@pytest.mark.parametrize("how", [(), ("--hops",)], ids=["ops", "higher-order-ops"])
def test_every_op_of_the_database_runs_the_same_on_the_gpu_and_on_a_stream(how):
    done = _run(str(SWEEP), "--device", "cuda", "--samples", "2", *how)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert int(summary.split()[0]) > (10 if how else 700), summary
    assert _only_any_mode(summary), summary


def test_a_write_the_capture_does_not_say_is_found(tmp_path):
    # The same sweep over a capture that watches nothing: each in-place and out= form writes
    # bytes that no event says.
    program = tmp_path / "blind.py"
    program.write_text(
        "import sys\n"
        "sys.argv = ['op_sweep']\n"
        "from tests import op_sweep\n"
        "from torch.testing._internal.common_methods_invocations import op_db\n"
        "sweep = op_sweep.Sweep(2)\n"
        "sweep.cap.pinned = type('Blind', (dict,), {'__setitem__': lambda *a: None})()\n"
        "sweep.sweep(next(op for op in op_db if op.name == 'add'))\n"
        "sweep.stop()\n"
        "for p in sweep.problems:\n"
        "    print(p.kind, p.form)\n")
    done = _run(str(program))
    assert done.returncode == 0, done.stderr[-2000:]
    found = set(done.stdout.splitlines())
    assert found == {"unsaid write inplace", "unsaid write out"}, done.stdout
