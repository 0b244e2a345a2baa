"""The PyTorch source on a GPU, op family by op family: each op is filed on the stream CUDA runs
it on, with the bytes it touches, and a correctly ordered program has no race.

An argument-only rule goes wrong where an op's CUDA memory is its result or its ``device=``
(``.to("cuda")``, factories), where it reads pinned memory on a stream (``non_blocking``
copies), or where it synchronizes inside (``nonzero``, ``.item()``). One program runs one op of
each family a line, under the boot as ``gpurace watch`` runs it; each line's ops are checked by
their site.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.capture.analysis import RunAnalysis

ROOT = Path(__file__).resolve().parent.parent


def _cuda_torch() -> bool:
    code = "import torch; assert torch.cuda.is_available()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _cuda_torch(), reason="needs PyTorch on a CUDA GPU")]

# One op family a line (line numbers are the checks' keys: keep the order).
_LINES = [
    "import torch",                                                                  # 1
    "import torch.nn.functional as F",                                               # 2
    "side = torch.cuda.Stream()",                                                    # 3
    "pinned = torch.arange(1024, dtype=torch.float32).pin_memory()",                 # 4
    "on_gpu = pinned.to('cuda', non_blocking=True)",                                 # 5
    "also = pinned.cuda()",                                                          # 6
    "zeros = torch.zeros(1024, device='cuda')",                                      # 7
    "back = on_gpu.to('cpu', non_blocking=True)",                                    # 8
    "torch.cuda.current_stream().synchronize()",                                     # 9
    "listed = back.tolist()",                                                        # 10
    "blocking = on_gpu.cpu()",                                                       # 11
    "zeros.copy_(pinned, non_blocking=True)",                                        # 12
    "zeros[torch.tensor([1, 2, 3])] = 5.0",                                          # 13
    "found = torch.nonzero(zeros)",                                                  # 14
    "picked = torch.masked_select(zeros, zeros > 1)",                                # 15
    "pair = [on_gpu.clone(), also.clone()]",                                         # 16
    "torch._foreach_add_(pair, 1.0)",                                                # 17
    "q = torch.randn(2, 4, 64, 32, device='cuda', dtype=torch.float16)",             # 18
    "attn = F.scaled_dot_product_attention(q, q, q)",                                # 19
    "w = torch.nn.Parameter(torch.randn(64, device='cuda'))",                        # 20
    "w.grad = torch.randn(64, device='cuda')",                                       # 21
    "torch.optim.AdamW([w], fused=True).step()",                                     # 22
    "side.wait_stream(torch.cuda.current_stream())",                                 # 23
    "with torch.cuda.stream(side):",                                                 # 24
    "    there = pinned.to('cuda', non_blocking=True)",                              # 25
    "torch.cuda.current_stream().wait_stream(side)",                                 # 26
    "total = (there + on_gpu).sum().item()",                                         # 27
    "staged = torch.empty(1024, pin_memory=True)",                                   # 28
    "staged.copy_(zeros)",                                                           # 29
    "def to_device(x: torch.Tensor) -> torch.Tensor: return x.to('cuda')",          # 30
    "to_device = torch.library.custom_op('gr::to_device', mutates_args=())(to_device)",  # 31
    "moved = to_device(torch.ones(16))",                                             # 32
    "print(json.dumps({'side': side.cuda_stream, "
    "'current': torch.cuda.current_stream().cuda_stream, 'total': total}))",        # 33
]


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> tuple[dict, list[list], list[dict]]:
    tmp = tmp_path_factory.mktemp("ops")
    prog = tmp / "ops.py"
    prog.write_text("import json\n" + "\n".join(_LINES) + "\n")  # line n of _LINES is n + 1
    events_path = tmp / "events.jsonl"
    done = subprocess.run([sys.executable, "-m", "harness.capture.boot", "--events",
                           str(events_path), "--", str(prog)], capture_output=True, text=True,
                          cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    analysis = RunAnalysis(None, {})
    analysis.feed(events)
    analysis.close()
    return (json.loads(done.stdout.splitlines()[-1]), events,
            [f.to_json() for f in analysis.findings])


def _ops(events: list[list], line: int) -> list[list]:
    return [e for e in events if e[0] == "op" and e[5].get("site") == f"ops.py:{line + 1}"]


def _spaces(spans: list[list]) -> set[str]:
    return {s[0] for s in spans}


def _line(events: list[list], line: int) -> tuple[set, set[str], set[str], set[str]]:
    """A line's ops together: their streams, kinds, and the spaces they read and write. (An
    op may go out in two parts: the host allocator's event record, or a synchronize, fires
    inside it, and its results' writes follow.)"""
    ops = _ops(events, line)
    assert ops, f"no op at line {line}"
    return ({op[1] for op in ops}, {op[2] for op in ops},
            set().union(*(_spaces(op[3]) for op in ops)),
            set().union(*(_spaces(op[4]) for op in ops)))


def test_host_to_device_copies_are_stream_copies_of_pinned_bytes(capture):
    streams, events, _ = capture
    for line, stream in ((5, "current"), (6, "current"), (25, "side"), (12, "current")):
        sids, kinds, reads, writes = _line(events, line)
        assert sids == {streams[stream]} and kinds == {"copy_htod"}, (line, sids, kinds)
        assert reads == {"h"} and writes == {"d"}, (line, reads, writes)


def test_factories_and_device_to_host_copies_run_on_the_current_stream(capture):
    streams, events, _ = capture
    assert _ops(events, 7) and all(op[1] == streams["current"] for op in _ops(events, 7))
    sids, kinds, _, writes = _line(events, 8)
    assert kinds == {"copy_dtoh"} and writes == {"h"}, (kinds, writes)  # a pinned result
    (op,) = _ops(events, 10)
    assert op[1] is None and op[2] == "host_read", op
    allocs = {e[2]: e for e in events if e[0] == "alloc"}
    written = op[3][0][1]
    assert any(e[1] == "h" and e[2] <= written < e[2] + e[3] for e in allocs.values())


def test_an_op_of_host_arguments_that_makes_device_memory_is_a_stream_op(capture):
    """A custom op that moves its CPU argument to the GPU inside (its own copy unseen): its
    result is found to be device memory only after it ran, and it is filed then, at the
    program's line, on the current stream."""
    streams, events, _ = capture
    sids, kinds, reads, writes = _line(events, 32)
    assert sids == {streams["current"]} and writes == {"d"} and reads == set(), (sids, writes)
    allocs = [e for e in events if e[0] == "alloc" and e[4]["site"] == "ops.py:33"]
    assert [e[1] for e in allocs] == ["d"], allocs


def test_no_host_op_touches_device_memory(capture):
    _, events, _ = capture
    host = [e for e in events if e[0] == "op" and e[1] is None]
    assert host and all(_spaces(e[3]) | _spaces(e[4]) <= {"h"} for e in host), host


def test_syncing_ops_and_fused_kernels_are_stream_ops(capture):
    streams, events, _ = capture
    for line in (13, 14, 15, 17, 19, 22):
        ops = _ops(events, line)
        assert ops and all(op[1] == streams["current"] for op in ops), (line, ops)
    # nonzero waits for its count on the host: a synchronize follows its op.
    first = _ops(events, 14)[0]
    after = events[events.index(first) + 1:]
    assert any(e[0] == "sync_stream" for e in after[:3]), after[:3]


def test_the_correct_program_has_no_race(capture):
    streams, _, findings = capture
    assert streams["total"] == 2 * sum(range(1024))
    assert findings == [], [f["missing"] for f in findings]
