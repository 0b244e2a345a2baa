"""Which pointers a Triton kernel reads and writes, read from its TTIR: the real compiler's
output for the kernels of tests/triton_ir/kernels.py (Triton 3.8.0, an sm_90 target, made on a
machine without a GPU), and, where an interpreter with Triton is at hand (this one or
GPURACE_TEST_PYTHON), the TTIR its Triton makes of them now.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.capture.triton_ir import UnreadableIR, kernel_access
from harness.capture.triton_source import inductor_names
from tests.frameworks import python_with, run_printing_json

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "tests" / "triton_ir"

# Per kernel: its pointer parameters, then those it reads, then those it writes.
EXPECTED = {
    "add": (("x_ptr", "y_ptr", "out_ptr"), {"x_ptr", "y_ptr"}, {"out_ptr"}),
    "scale_inplace": (("x_ptr",), {"x_ptr"}, {"x_ptr"}),
    # A pointer carried through a loop's iter_args is still x_ptr's.
    "rowsum_loop": (("x_ptr", "out_ptr"), {"x_ptr"}, {"out_ptr"}),
    # The bins are indexed by loaded values: x_ptr is read, not written.
    "histogram": (("x_ptr", "hist_ptr"), {"x_ptr", "hist_ptr"}, {"hist_ptr"}),
    "copy_via_helper": (("src_ptr", "dst_ptr"), {"src_ptr"}, {"dst_ptr"}),
    # A pointer chosen between two: a store through it writes both (conservative).
    "pick": (("a_ptr", "b_ptr"), set(), {"a_ptr", "b_ptr"}),
    "desc_copy": (("src_ptr", "dst_ptr"), {"src_ptr"}, {"dst_ptr"}),
}


def _check(folder: Path) -> None:
    for name, (pointers, read, written) in EXPECTED.items():
        access = kernel_access((folder / f"{name}.ttir").read_text())
        assert access.name == name
        assert (access.pointers, set(access.read), set(access.written)) == (
            pointers, read, written), name


def test_the_recorded_ttir_says_which_pointers_each_kernel_reads_and_writes() -> None:
    _check(KERNELS)
    assert kernel_access((KERNELS / "add.ttir").read_text()).params == (
        "x_ptr", "y_ptr", "out_ptr", "n")  # the constexpr BLOCK is not a parameter


def test_what_it_cannot_follow_is_said_not_guessed() -> None:
    with pytest.raises(UnreadableIR, match="no tt.func"):
        kernel_access("module {\n}\n")
    helper = (KERNELS / "copy_via_helper.ttir").read_text()
    with pytest.raises(UnreadableIR, match="2 public functions"):
        kernel_access(helper.replace("tt.func private", "tt.func public"))
    with pytest.raises(UnreadableIR, match="a call to a function not in the module"):
        kernel_access(helper.split("tt.func private")[0])


TRITON_PYTHON = python_with("triton.compiler")


@pytest.mark.skipif(TRITON_PYTHON is None,
                    reason="no interpreter with Triton here (GPURACE_TEST_PYTHON)")
def test_the_ttir_this_triton_makes_reads_the_same(tmp_path: Path) -> None:
    done = subprocess.run([TRITON_PYTHON, str(KERNELS / "kernels.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    _check(tmp_path)


_INSTALL = r'''
import io, json
from triton.runtime.jit import JITFunction
from harness.capture import events as E
from harness.capture.source import load
source = load("triton")
original = JITFunction.run
buf = io.StringIO()
sink = E.Sink(buf)
stop = source.install(sink)
wrapped = JITFunction.run is not original
import torch._inductor.runtime.triton_heuristics as inductor  # torch.compile's launcher
inductor_wrapped = inductor.CachingAutotuner.run.__module__
stop()
sink.flush()
events = [json.loads(line) for line in buf.getvalue().splitlines()]
print(json.dumps({"version": source.available(), "wrapped": wrapped,
                  "restored": JITFunction.run is original,
                  "inductor": [inductor_wrapped, inductor.CachingAutotuner.run.__module__],
                  "kinds": [e[0] for e in events],
                  "stats": [e[1]["source"] for e in events if e[0] == "stats"]}))
'''


@pytest.mark.skipif(TRITON_PYTHON is None,
                    reason="no interpreter with Triton here (GPURACE_TEST_PYTHON)")
def test_the_triton_source_wraps_the_launch_and_puts_it_back(tmp_path: Path) -> None:
    """Switched on, the Triton source stands in JITFunction.run (every @triton.jit launch
    passes there), and in torch.compile's CachingAutotuner.run once the program imports it;
    switched off, the originals are back. A launch needs a GPU:
    tests/test_engine_programs_gpu.py watches one."""
    assert TRITON_PYTHON is not None
    got, _ = run_printing_json(TRITON_PYTHON, _INSTALL, tmp_path)
    assert got["version"] and got["wrapped"] and got["restored"]
    assert got["inductor"] == ["harness.capture.triton_source",
                               "torch._inductor.runtime.triton_heuristics"]
    assert got["kinds"] == ["note", "stats"] and got["stats"] == ["triton"]


def test_an_inductor_kernel_without_its_ttir_is_read_by_inductors_names() -> None:
    """in_ptr read, out_ptr written, in_out_ptr and what Inductor lists as mutated both; a
    parameter of another name (a kernel of the program's own inside compiled code) both,
    unless it is an in_ptr."""
    got = inductor_names(("in_ptr0", "in_ptr1", "out_ptr0", "in_out_ptr0", "x_ptr", "xnumel"),
                         frozenset({"in_ptr1"}))
    assert got.read == {"in_ptr0", "in_ptr1", "in_out_ptr0", "x_ptr", "xnumel"}
    assert got.written == {"in_ptr1", "out_ptr0", "in_out_ptr0", "x_ptr", "xnumel"}
