"""`op: kernel` on the GPU (marker gpu): kvcore's touch kernel (kernels.cu's kv_touch) reads and
writes leases and mapped pinned buffers as the simulated device does, so the same scenarios give
the same verdicts and findings on both."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.scenario import load_scenario
from test_kernel_step import FORWARD_OFFLOAD, HEAD, parts

pytestmark = pytest.mark.gpu


def _verdicts(tmp_path: Path, text: str, backend: str, trials: int = 20) -> dict[str, tuple]:
    path = tmp_path / f"kernels-{backend}.yaml"
    path.write_text(text)
    result = Runner(RunOptions(backend=backend, trials=trials, out_dir=tmp_path / backend)).run(
        [load_scenario(path)])
    return {r.variant: (r.manifested, r.detected, [f["missing"] for f in r.finding_summary(1)])
            for r in result.results}


def test_a_kernels_write_races_a_copy_on_the_gpu_as_on_the_simulated_device(tmp_path):
    sim, cuda = (_verdicts(tmp_path, FORWARD_OFFLOAD, b) for b in ("sim", "cuda"))
    print("kernel forward-offload: sim", sim, "cuda", cuda)
    assert cuda["buggy"][0] >= 19 and cuda["buggy"][1] == 20  # 200 us of kernel: the window
    assert cuda["fixed"][:2] == (0, 0)
    assert cuda["buggy"][2] == sim["buggy"][2]


def test_a_kernel_writes_every_span_it_names_on_the_gpu(tmp_path):
    fills = "".join(f"    - {{op: host_fill, buffer: b{i}, byte: 0}}\n" for i in range(10))
    names = ", ".join(f"b{i}" for i in range(10))
    checks = "".join(f"    - {{op: check, buffer: b{i}, byte: 0x33}}\n" for i in range(10))
    text = HEAD.replace("reproduces, min_rate: 0.9", "clean") + \
        "    - {id: kv, op: materialize, pages: 3}\n" + fills + (
            f"    - {{id: wide, op: kernel, stream: compute, reads: [kv], writes: [{names}], "
            "byte: 0x33, us: 5}\n    - {op: synchronize}\n") + checks
    got = _verdicts(tmp_path, text, "cuda", 3)
    assert got["buggy"][:2] == (0, 0) and got["fixed"][:2] == (0, 0)


@pytest.mark.parametrize("writes, reads", [
    ("{lease: kv, page: 1}", "{lease: kv, page: 0}"),
    ("{lease: kv, page: 1}", "{lease: kv, page: [0, 1]}"),
    ("{lease: kv, offset: 1000, length: 100}", "{lease: kv, page: 1}"),
])
def test_a_kernels_parts_race_on_the_gpu_as_on_the_simulated_device(tmp_path, writes, reads):
    sim, cuda = (_verdicts(tmp_path, parts(writes, reads), b, 3) for b in ("sim", "cuda"))
    print("kernel parts", writes, reads, "sim", sim["buggy"][1], "cuda", cuda["buggy"][1])
    assert cuda["buggy"][1:] == sim["buggy"][1:]
