"""The PyTorch source on PyTorch for the CPU: it never changes what a program does, and it files
each op where CUDA runs it.

These need an interpreter with PyTorch (this one, or GPURACE_TEST_PYTHON; a CPU build does) and
no GPU; CI has neither, and skips them. On a GPU the same behaviour is held by the real programs
of tests/real_programs (make test-gpu-real).
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.frameworks import python_with

ROOT = Path(__file__).resolve().parent.parent


TORCH_PYTHON = python_with("torch")
pytestmark = pytest.mark.skipif(TORCH_PYTHON is None,
                                reason="no interpreter with PyTorch here (GPURACE_TEST_PYTHON)")

# Ordinary PyTorch work that broke or bothered earlier captures: FSDP2's DTensor parameters
# (PyTorch's FSDP2 tutorial, on one gloo rank), a DataLoader whose workers are forked,
# fake, meta, sparse, nested and quantized tensors, torch.compile, a thread of the program's.
_ORDINARY = r'''
import os, socket, threading, warnings
warnings.simplefilter("ignore")
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
for layer in (model[0], model[2], model):
    fully_shard(layer)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(64, 16), torch.randn(64, 4)
for _ in range(3):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
print("fsdp", round(loss.item(), 4))
dist.destroy_process_group()
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.arange(32)), batch_size=8,
                    num_workers=2)
print("loader", sum(int(b[1].sum()) for b in loader))
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    f = torch.ones(4, 4) @ torch.ones(4, 4)
print("fake", tuple(f.shape), (torch.ones(3, device="meta") * 2).shape)
print("sparse", (torch.eye(3).to_sparse() * 2).to_dense().sum().item())
print("nested", torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]).size(0))
q = torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)
print("quantized", q.dequantize().sum().item())
print("compiled", round(float(torch.compile(lambda t: (t.sin() + 1).cos(),
                                            backend="aot_eager")(torch.ones(4)).sum()), 4))
got = []
worker = threading.Thread(target=lambda: got.append(float((torch.ones(3) * 3).sum())))
worker.start()
worker.join()
print("thread", got)
print("file", os.path.isabs(__file__))  # `python prog.py` makes it absolute
# Higher-order ops run eagerly (torchao's pt2e reference ops call out_dtype).
from torch._higher_order_ops.out_dtype import out_dtype
from torch._higher_order_ops.scan import scan
from torch.nn.attention.flex_attention import flex_attention
i8 = torch.ones(4, 4, dtype=torch.int8)
print("out_dtype", out_dtype(torch.ops.aten.mm.default, torch.int32, i8, i8).sum().item())
print("scan", scan(lambda c, x: (c + x, c.clone()), torch.zeros(2), torch.ones(3, 2))[0])
print("cond", torch.cond(torch.tensor(True), lambda a: a + 1, lambda a: a - 1,
                         (torch.ones(2),)).tolist())
q = torch.ones(1, 1, 4, 8)
print("flex", flex_attention(q, q, q).sum().item())
# A subclass made from a tensor, as tensordict makes its MemoryMappedTensor.
class Wrapped(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl
print("subclass", type(Wrapped(torch.ones(2))).__name__, Wrapped(torch.ones(2)).sum().item())
# A torch.jit.trace graph, whose constant numbers reach a mode as Python numbers where its ops
# want tensors (torch_geometric 2.9's maybe_num_nodes, traced, and run on another size).
def nodes(e):
    return torch.arange(0, torch.cat([e.view(-1), e.new_full((1,), -1)]).max() + 1)
traced = torch.jit.trace(nodes, (torch.tensor([[0, 1], [1, 2]]),))
print("traced", traced(torch.tensor([[0, 4], [1, 2]])).tolist())
try:  # an op's own error, with a number where it takes one: raised as it is, once
    torch.ones(2, dtype=torch.long).add_(1.5)
except RuntimeError as e:
    print("own error", e, repr(e.__context__))
'''


def _boot(tmp_path: Path, program: str, *extra: str) -> tuple[subprocess.CompletedProcess[str],
                                                             list[list]]:
    prog = tmp_path / "prog.py"
    prog.write_text(program)
    events = tmp_path / "events.jsonl"
    done = subprocess.run([TORCH_PYTHON, "-m", "harness.capture.boot", "--events", str(events),
                           *extra, "--", prog.name], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=300)
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    return done, lines


def test_ordinary_pytorch_work_runs_watched_as_it_runs_alone(tmp_path):
    """FSDP2, forked DataLoader workers, subclasses (used and made) and odd layouts,
    torch.compile, a traced function, a thread and higher-order ops run eagerly: the watched
    run prints what the bare run prints, says nothing more on stderr, and its capture read
    every op it was given (no failure counted); the higher-order ops, whose insides it cannot
    see, are named in a note."""
    prog = tmp_path / "alone.py"
    prog.write_text(_ORDINARY)
    bare = subprocess.run([TORCH_PYTHON, prog.name], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert bare.returncode == 0, bare.stderr
    watched, events = _boot(tmp_path, _ORDINARY)
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout == bare.stdout
    assert watched.stderr == bare.stderr  # nothing of the capture's on the program's stderr
    (stats,) = [e[1] for e in events if e[0] == "stats" and e[1]["source"] == "torch"]
    assert stats["failures"] == {} and stats["ops"] > 100, stats
    assert events[-1][0] == "exit" and events[-1][1]["status"] == 0
    (note,) = [e[1] for e in events if e[0] == "note" and "higher-order" in e[1]]
    assert note.endswith("not seen: cond (1x), flex_attention (1x), out_dtype (1x), "
                         "scan (1x)"), note


# The source's reading of single ops, in process: the CUDA stream id is the one thing a CPU
# build cannot give, so the current stream is stream 7 here, and a storage is taken for pinned
# memory as a CUDA build's pin_memory() would make it.
_OPS = r'''
import io, json, sys
import torch
from harness.capture import events as E, torch_ops as O, torch_source as T
buf = io.StringIO()
sink = E.Sink(buf)
stop = T.install(sink)
cap = stop.capture
cap.raw_stream = lambda index: 7
host = torch.arange(16, dtype=torch.float32)
cap.pinned[host.untyped_storage().data_ptr()] = {}
aten = torch.ops.aten
before = cap.before
pending = before(cap.plans.setdefault(aten._to_copy.default, O.Plan(aten._to_copy.default)),
                 (host,), {"device": torch.device("cuda", 0), "non_blocking": True}, 0)
cap.copied_pinned(pending)  # as dispatch does once the op went out
cap.copied_pinned(pending)  # a second copy of the block on the stream: its event again
print(json.dumps({"to_cuda": pending.event[:3] + [[s[2] for s in pending.event[3]]]}))
# The same bytes handed out again by the host allocator: the host waited for the event
# recorded after the copy, then the old owner is gone.
cap.pinned_again(host.untyped_storage().data_ptr(), "prog.py:9")
sink.flush()
edges = [json.loads(l) for l in buf.getvalue().splitlines()
         if l.startswith(('["record"', '["sync_event"', '["free"'))]
said = [l for l in buf.getvalue().splitlines() if l.startswith('["event"')]
print(json.dumps({"edges": [[e[0], e[1] if e[0] != "free" else e[3]["streams"]]
                            + ([e[2]] if e[0] == "record" else []) for e in edges],
                  "said": len(said)}))
# The host's own work on pinned bytes stays the host's.
cap.pinned[host.untyped_storage().data_ptr()] = {}
pending = before(cap.plans.setdefault(aten.mul.Tensor, O.Plan(aten.mul.Tensor)),
                 (host, host), {}, 0)
print(json.dumps({"host": pending.event[:3]}))
# Factories on the device: their device= names the stream; an allocation alone is no op.
plan = lambda op: cap.plans.setdefault(op, O.Plan(op))
zeros = before(plan(aten.zeros.default), ([4],), {"device": torch.device("cuda", 0)}, 0)
empty = before(plan(aten.empty.memory_format), ([4],), {"device": "cuda:0"}, 0)
pinned = before(plan(aten.empty.memory_format), ([4],), {"pin_memory": True}, 0)
print(json.dumps({"zeros": zeros.event[:3], "empty": [empty.sid, empty.event],
                  "pinned": [pinned.sid, pinned.pins]}))
# A result in pinned memory (a CPU build pins nothing: is_pinned is taken at its word here):
# its allocation goes out before the op, and the op writes it.
torch.Tensor.is_pinned = lambda self: True
mul = plan(aten.mul.Tensor)
pending = before(mul, (host, host), {}, 0)
pending.pins = True
cap.on = False
result = host * host
cap.on = True
written = cap.outputs(mul, result, pending)
sink.flush()
allocs = [json.loads(l) for l in buf.getvalue().splitlines() if l.startswith('["alloc"')]
print(json.dumps({"result": [[w[0], w[2]] for w in written],
                  "alloc": [[a[1], a[3]] for a in allocs
                            if a[2] == result.untyped_storage().data_ptr()]}))
del torch.Tensor.is_pinned
# A failure inside the source: counted, said, and the op runs as it would.
def broken(t):
    raise RuntimeError("no storage here")
cap.memory = broken
twice = host * 2
stop()
sink.flush()
events = [json.loads(l) for l in buf.getvalue().splitlines()]
stats = [e[1] for e in events if e[0] == "stats"][0]
print(json.dumps({"twice": twice[:3].tolist(), "failures": list(stats["failures"].values()),
                  "notes": [e[1] for e in events if e[0] == "note" and "could not" in e[1]]}))
'''


def _run_in_process(tmp_path: Path, program: str, *args: str
                    ) -> subprocess.CompletedProcess[str]:
    """``program`` run as a script with this checkout importable; it must exit 0."""
    prog = tmp_path / "prog.py"
    prog.write_text(program)
    done = subprocess.run([TORCH_PYTHON, str(prog), *args], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_a_host_to_device_copy_is_a_stream_copy_and_failures_are_counted(tmp_path):
    """``pinned.to("cuda", non_blocking=True)`` is a copy on the current stream reading the
    pinned bytes (not the host's access); the host allocator's event is recorded after it, and
    the block's reuse waits for that event before freeing the old owner; a CPU op on pinned
    bytes is the host's; a factory's ``device=`` names its stream, and an allocation alone is
    no op; a new result in watched memory is allocated, then written; a failure of the
    source's own code is counted and said, and the op's answer unchanged."""
    done = _run_in_process(tmp_path, _OPS)
    got = [json.loads(line) for line in done.stdout.splitlines()]
    assert got[0] == {"to_cuda": ["op", 7, "copy_htod", [64]]}
    # One event per block and stream, said once and recorded after each copy: the watching
    # side keeps one per block, not one per copy.
    event = got[1]["edges"][0][1]
    assert re.fullmatch(r"host-allocator-[0-9a-f]+-7", event), got[1]
    assert got[1] == {"edges": [["record", event, 7], ["record", event, 7],
                                ["sync_event", event], ["free", []]], "said": 1}
    assert got[2] == {"host": ["op", None, "host_read"]}
    assert got[3] == {"zeros": ["op", 7, "kernel:zeros"], "empty": [7, None],
                      "pinned": [None, True]}
    assert got[4] == {"result": [["h", 64]], "alloc": [["h", 64]]}
    assert got[5]["twice"] == [0.0, 2.0, 4.0]
    assert got[5]["failures"] == [1] and len(got[5]["notes"]) == 2, got[5]
    assert done.stderr == ""


def test_a_callback_near_the_bottom_of_the_stack_finds_no_frame_and_raises_nothing():
    """A callback fired with fewer frames above it than a source asks for gets None, not
    ``ValueError: call stack is not deep enough`` (which PyTorch logged on the program's
    stderr)."""
    from harness.capture.sites import program_frame
    assert program_frame(10_000) is None


def test_the_op_cost_tool_times_each_part_and_its_capture_is_clean(tmp_path):
    """python -m harness.capture.opcost on the CPU: a row per size and op, the source's own
    time measured, the correct loop it captured has no race, and --parts profiles the
    source's own functions (each captured op through its ``before``)."""
    done = subprocess.run([TORCH_PYTHON, "-m", "harness.capture.opcost", "--device", "cpu",
                           "--ops", "200", "--rounds", "1", "--sizes", "4096", "--json",
                           "--parts"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [(r["bytes"], r["op"]) for r in result["rows"]] == [
        (4096, "add_out"), (4096, "add_new"), (4096, "add_out_long"), (4096, "host_add_new")]
    assert all(r["own_us"] > 0 and r["bare_us"] > 0 for r in result["rows"])
    assert result["findings"] == 0 and result["events"] > 400
    assert all(r["trace_us"] is None for r in result["rows"])  # a GPU's only
    befores = [p for p in result["parts"] if p["function"].startswith("before (torch_capture")]
    assert len(befores) == 1 and befores[0]["calls"] == 4 * 200


# Under inference_mode the dispatcher hands a dispatch mode composite ops whole: linear, and
# .to(), whose schema says it may return its input. transformers' offloaded cache copies its
# layers with .to() under generate's inference mode (transformers 5.17, cache_utils.py 79-86).
_INFERENCE = r'''
import io, json
import torch
from harness.capture import events as E, torch_source as T
buf = io.StringIO()
sink = E.Sink(buf)
from torch.utils import checkpoint
stop = T.install(sink)
early_stop = [checkpoint._enable_checkpoint_early_stop]
cap = stop.capture
host = torch.arange(16, dtype=torch.float32).reshape(4, 4)
cap.pinned[host.untyped_storage().data_ptr()] = {}  # as pin_memory() would make it
weight = torch.eye(4)
with torch.inference_mode():
    wide = host.to(torch.float64)
    same = host.to(torch.float32)
    out = torch.nn.functional.linear(host, weight)
stop()
early_stop.append(checkpoint._enable_checkpoint_early_stop)
sink.flush()
ops = [json.loads(l) for l in buf.getvalue().splitlines() if l.startswith('["op"')]
print(json.dumps({"ops": [[e[2], e[5]["op"]] for e in ops], "same": same is host,
                  "wide": wide[1].tolist(), "out": out[1].tolist(), "early_stop": early_stop}))
'''


def test_under_inference_mode_a_composite_that_may_return_its_input_is_decomposed(tmp_path):
    """``.to(dtype)`` and ``linear`` of pinned bytes under ``torch.inference_mode()``: ``.to()``
    may return its input (its schema says so), so the capture runs its decomposition and sees
    the copy it makes (``_to_copy``), and ``.to()`` to the dtype a tensor has still returns the
    tensor itself. ``linear`` is watched whole, as its schema says, and run as PyTorch runs it
    (a decomposition run inside the mode rounds differently). The answers are the ones PyTorch
    gives. Activation checkpointing's early stop is off while the capture is on (it raises
    through PyTorch's C++ code, which the GPU trace breaks), and back as it was after."""
    done = _run_in_process(tmp_path, _INFERENCE)
    got = json.loads(done.stdout)
    names = [name for _, name in got["ops"]]
    assert "_to_copy" in names and "to" not in names, got["ops"]
    assert "linear" in names and not {"addmm", "mm", "matmul"} & set(names), got["ops"]
    assert all(kind == "host_read" for kind, _ in got["ops"]), got["ops"]
    assert got["same"] is True
    assert got["wide"] == [4.0, 5.0, 6.0, 7.0] and got["out"] == [4.0, 5.0, 6.0, 7.0]
    assert got["early_stop"] == [False, None]


# An op with a decomposition and kernels of its own (silu_backward, as autograd runs it in a
# backward pass) runs its own kernel without the mode, so it must under the mode too: its
# decomposition rounds differently (found by tests/op_sweep.py --grad). A composite op under
# inference_mode (matmul) runs as PyTorch runs it: its decomposition, run inside the mode or
# from Python, rounds differently too (found by tests/hf_sweep.py in 158 language models'
# generate). And autograd's ZeroTensor, a tensor whose storage cannot be read, is no failure
# of the capture's.
_OWN_KERNEL = r'''
import io, json
import torch
from harness.capture import events as E, torch_source as T
torch.manual_seed(0)
x = torch.randn(4096, requires_grad=True)
def grad():
    return torch.autograd.grad(torch.nn.functional.silu(x).sum(), x)[0]
h, w = torch.randn(2, 8, 64), torch.randn(128, 64)
def head():  # a language model's head on the last position, as generate runs it
    with torch.inference_mode():
        return h[:, -1:, :] @ w.t()
bare, bare_head = grad(), head()
buf = io.StringIO()
sink = E.Sink(buf)
stop = T.install(sink)
cap = stop.capture
cap.pinned = type("AllHost", (dict,), {"__contains__": lambda self, k: True,
                                         "__len__": lambda self: 1})()
watched, watched_head = grad(), head()
zero = torch._efficientzerotensor(4)  # (zero + 1 fails under any dispatch mode: PyTorch's)
stop()
sink.flush()
ops = [json.loads(l)[5]["op"] for l in buf.getvalue().splitlines() if l.startswith('["op"')]
print(json.dumps({"same": torch.equal(bare, watched), "ops": ops, "zero": zero._is_zerotensor(),
                  "same_head": torch.equal(bare_head, watched_head),
                  "failures": dict(cap.guard.counts)}))
'''


def test_an_op_with_a_kernel_of_its_own_runs_it_and_a_zero_tensor_is_no_failure(tmp_path):
    got = json.loads(_run_in_process(tmp_path, _OWN_KERNEL).stdout)
    assert "silu_backward" in got["ops"] and "sigmoid" not in got["ops"], got["ops"]
    assert got["same"] is True and got["same_head"] is True
    assert got["zero"] is True
    assert got["failures"] == {}


# A tensor of another kind (nested, sparse) runs its own kernel of a composite op, which the
# dispatcher picks by the tensor's kind: the capture may not decompose the op for it. Found by
# PyTorch's test/test_nestedtensor.py under pytest --gpurace-watch (chunk of a nested tensor
# decomposed to split, which nested tensors lack: NotImplementedError).
_OTHER_KINDS = r'''
import json, warnings
import torch
from harness.capture import events as E, torch_source as T
warnings.simplefilter("ignore")  # nested tensors are a prototype: PyTorch says so
def work():
    nt = torch.nested.nested_tensor([torch.arange(6.).reshape(2, 3), torch.ones(4, 3)])
    chunks = [[t.tolist() for t in c.unbind()] for c in nt.chunk(3, dim=-1)]
    sparse = torch.eye(3).to_sparse()
    return {"chunks": chunks, "sparse": sparse.to(torch.float64).to_dense().tolist(),
            "flat": torch.arange(4.).reshape(2, 2).reshape(4).tolist()}
bare = work()
sink = E.Sink(open("events.jsonl", "w"))
stop = T.install(sink)
cap = stop.capture
with torch.inference_mode():
    watched = work()
stop()
print(json.dumps({"same": watched == bare, "failures": dict(cap.guard.counts)}))
'''


def test_a_composite_op_of_a_nested_or_sparse_tensor_runs_that_tensors_own_kernel(tmp_path):
    got = json.loads(_run_in_process(tmp_path, _OTHER_KINDS).stdout)
    assert got == {"same": True, "failures": {}}, got


# A value read by the host (.item(), bool()) is a copy to the host however it reaches the
# mode: as _local_scalar_dense, or, under inference_mode, whole (item, is_nonzero).
_SCALARS = r'''
import json
import torch
from harness.capture import events as E, torch_source as T
sink = E.Sink(open("events.jsonl", "w"))
stop = T.install(sink)
cap = stop.capture
seen = []
dispatch = cap.dispatch
def told(plan, func, args, kwargs):
    seen.append([plan.name, cap._kind(plan, args, kwargs)])
    return dispatch(plan, func, args, kwargs)
cap.dispatch = told
x = torch.ones(1)
x.item(), bool(x)
with torch.inference_mode():
    x.item(), bool(x)
stop()
print(json.dumps(seen))
'''


def test_a_value_the_host_reads_is_a_copy_to_the_host_under_inference_mode_too(tmp_path):
    seen = json.loads(_run_in_process(tmp_path, _SCALARS).stdout)
    assert seen == [["ones", "kernel:ones"], ["_local_scalar_dense", "copy_dtoh"],
                    ["_local_scalar_dense", "copy_dtoh"], ["item", "copy_dtoh"],
                    ["is_nonzero", "copy_dtoh"]], seen


# A program that goes quiet after it made a tensor (a serving loop between two requests) has
# that tensor's allocation written by the sink's writer for quiet times: with the program's
# name for it, which it would have got at the next op. A CPU makes no pinned memory, so the
# allocation is held here as the capture holds a CUDA tensor's (Capture.outputs).
_QUIET = r'''
import json, sys, time
import torch
from harness.capture import events as E, torch_source as T
sink = E.Sink.to_path("events.jsonl")
stop = T.install(sink)
cap = stop.capture
sink.flush_when_quiet(0.05)
def request():
    staged = torch.ones(256)
    base = staged.untyped_storage().data_ptr()
    meta = {"what": "float32[256]", "name": None}
    cap.sink.hold(["alloc", "d", base, 1024, meta])
    cap.to_name.append((meta, sys._getframe(), base))
    time.sleep(0.5)  # between two requests: the writer writes what is held meanwhile
    return staged
request()
print(json.dumps([e[4]["name"] for e in E.iter_file("events.jsonl") if e[0] == "alloc"]))
stop()
'''


def test_a_tensor_made_before_the_program_goes_quiet_is_written_with_its_name(tmp_path):
    names = json.loads(_run_in_process(tmp_path, _QUIET).stdout)
    assert names == ["staged"], names


# A watched child starts its capture at its first use of CUDA, which may come inside the
# program's own dispatch mode (a FlopCounterMode around a model's first step). The capture's
# mode goes beneath it: the program's mode counts as it would alone and pops itself, and the
# capture stays on. Stopped inside another mode, the capture leaves that one on.
_BENEATH = r'''
import io, json
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.flop_counter import FlopCounterMode
from harness.capture import events as E, torch_source as T
x = torch.ones(4, 4)
with FlopCounterMode(display=False) as bare:
    x @ x
with FlopCounterMode(display=False) as counted:
    stop = T.install(E.Sink(io.StringIO()))
    x @ x
stack = [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
seen = stop.capture.ops
x @ x
seen_after = stop.capture.ops - seen
with FlopCounterMode(display=False) as around_stop:
    stop()
    x @ x
print(json.dumps({"bare": bare.get_total_flops(), "counted": counted.get_total_flops(),
                  "stack": stack, "seen_after": seen_after,
                  "around_stop": around_stop.get_total_flops(),
                  "left": len(_get_current_dispatch_mode_stack())}))
'''


def test_a_capture_started_inside_the_programs_mode_goes_beneath_it(tmp_path):
    got = json.loads(_run_in_process(tmp_path, _BENEATH).stdout)
    assert got["counted"] == got["bare"] == 128, got
    assert got["stack"] == ["_Mode"] and got["seen_after"] >= 1, got
    assert got["around_stop"] == 128 and got["left"] == 0, got


# Ops PyTorch runs without Python (TorchScript's, the autograd engine's) reach the capture's
# mode with the program's torch-function modes on. Alone, such a mode (torch.library.opcheck's,
# found by torchvision's test_ops.py) sees none of them; watched, it must not see the capture's
# reads of their tensors (t.layout, t.is_cuda) nor the op called again from the mode.
_FUNCTION_MODE = r'''
import io, json
import torch
from torch.overrides import TorchFunctionMode
from harness.capture import events as E, torch_source as T

@torch.jit.script
def scripted(x):
    return torch.sin(x) + 1

seen = []
class Seen(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))

def run():
    seen.clear()
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3, requires_grad=True)
    loss = (x * y).sum()
    with Seen():
        scripted(x.detach())
        loss.backward()
    return list(seen)

bare = run()
stop = T.install(E.Sink(io.StringIO()))
watched = run()
stop()
print(json.dumps({"bare": bare, "watched": watched}))
'''


def test_the_programs_function_modes_see_no_more_of_ops_run_without_python(tmp_path):
    got = json.loads(_run_in_process(tmp_path, _FUNCTION_MODE).stdout)
    assert got["watched"] == got["bare"], got


# Batch norm writes its running statistics while it trains, and its schema does not say so
# (native_batch_norm, cudnn_batch_norm): found by tests/op_sweep.py --grad.
_BATCH_NORM = r'''
import io, json
import torch
from harness.capture import events as E, torch_source as T
torch.manual_seed(0)
bn = torch.nn.BatchNorm1d(8)
x = torch.randn(16, 8)
buf = io.StringIO()
sink = E.Sink(buf)
stop = T.install(sink)
cap = stop.capture
cap.pinned = type("AllHost", (dict,), {"__contains__": lambda self, k: True,
                                         "__len__": lambda self: 1})()
stats = bn.running_mean.untyped_storage().data_ptr()
said = {}
for mode in ("train", "eval"):
    getattr(bn, mode)()
    sink.flush()
    start = buf.tell()
    bn(x)
    sink.flush()
    ops = [json.loads(l) for l in buf.getvalue()[start:].splitlines() if l.startswith('["op"')]
    said[mode] = {how: sorted({e[5]["op"] for e in ops for span in e[at] if span[1] == stats})
                  for how, at in (("read", 3), ("written", 4))}
stop()
print(json.dumps(said))
'''


def test_batch_norm_writes_its_running_statistics_only_while_it_trains(tmp_path):
    said = json.loads(_run_in_process(tmp_path, _BATCH_NORM).stdout)
    assert said["train"]["written"], said
    assert said["eval"]["written"] == [] and said["eval"]["read"], said


# Ops of a compiled function's graph break run eagerly with Dynamo's frame hook on; the
# capture's code must never run under it (Dynamo would trace it), and starting the capture
# must not import Dynamo for a program that never compiles.
_UNDER_DYNAMO = r'''
import io, json, sys
import torch
from torch._C._dynamo.eval_frame import set_eval_frame
from harness.capture import events as E, torch_source as T
stop = T.install(E.Sink(io.StringIO()))
imported = sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules)
cap = stop.capture
dispatch, hooked = cap.dispatch, []
def looking(plan, func, args, kwargs):  # what the hook is while the capture's code runs
    prior = set_eval_frame(None)
    set_eval_frame(prior)
    hooked.extend([plan.name] if prior not in (None, False) else [])
    return dispatch(plan, func, args, kwargs)
cap.dispatch = looking
def helper(t):
    return float(t.sum())  # a graph break: run eagerly, under the hook
def f(t):
    t = t.sin() + 1
    return t.cos() * helper(t)
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
mode = type(_get_current_dispatch_mode())
answer = float(torch.compile(f, backend="eager")(torch.ones(4)).sum())
stop()
compiled = [name for name, fn in vars(mode).items() if hasattr(fn, "__code__")
            and _debug_get_cache_entry_list(fn.__code__)]  # frames of the mode's Dynamo compiled
print(json.dumps({"imported": imported, "hooked": hooked, "compiled": compiled,
                  "answer": round(answer, 4), "eager": round(float(f(torch.ones(4)).sum()), 4)}))
'''


def test_the_capture_runs_outside_dynamos_frame_hook_and_does_not_import_dynamo(tmp_path):
    """Installing the capture imports neither Dynamo nor sympy (seconds at a program's start),
    and the ops a compiled function's graph break runs eagerly reach the capture with
    Dynamo's frame hook off, so Dynamo never traces the capture's own code: not even the
    mode's entry, whose first line turns the hook off."""
    got = json.loads(_run_in_process(tmp_path, _UNDER_DYNAMO).stdout)
    assert got["imported"] == []
    assert got["hooked"] == []
    assert got["compiled"] == []
    assert got["answer"] == got["eager"]


# An extension's ops, one whose schema says what it writes and one that says nothing (it
# returns nothing and marks no argument written, as C++ extensions' ops often do).
_EXTENSION = r'''
import io, json
import torch
from harness.capture import events as E, torch_source as T
lib = torch.library.Library("gpurace_test", "DEF")
lib.define("scale_into(Tensor out, Tensor x) -> ()")
lib.define("scale_into_said(Tensor(a!) out, Tensor x) -> ()")
def scale(out, x):
    out.copy_(x * 2)
lib.impl("scale_into", scale, "CPU")
lib.impl("scale_into_said", scale, "CPU")
buf = io.StringIO()
sink = E.Sink(buf)
stop = T.install(sink)
out, x = torch.zeros(4), torch.ones(4)
for t in (out, x):  # as pin_memory() makes them
    stop.capture.pinned[t.untyped_storage().data_ptr()] = {}
for _ in range(2):
    torch.ops.gpurace_test.scale_into(out, x)
torch.ops.gpurace_test.scale_into_said(out, x)
stop()
sink.flush()
events = [json.loads(line) for line in buf.getvalue().splitlines()]
print(json.dumps({"ops": [[e[5]["op"], len(e[3]), len(e[4])] for e in events if e[0] == "op"],
                  "notes": [e[1] for e in events if e[0] == "note"],
                  "out": out.tolist()}))
'''


def test_an_extension_op_that_says_nothing_of_its_writes_is_named_in_the_notes(tmp_path):
    """An op of an extension whose schema marks no argument written and that returns nothing
    writes something unsaid: its reads are checked, and the run's notes name it and count
    its calls; an op whose schema says what it writes is read as usual."""
    got = json.loads(_run_in_process(tmp_path, _EXTENSION).stdout)
    assert got["out"] == [2.0] * 4
    assert got["ops"] == [["scale_into", 2, 0]] * 2 + [["scale_into_said", 1, 1]]
    (note,) = [n for n in got["notes"] if "extension ops" in n]
    assert note.endswith("only their reads were checked: gpurace_test::scale_into (2x)")


# A compiled function that calls methods the source patches (Tensor.tolist, Tensor.numpy):
# run watched and bare, Dynamo must compile the same frames and break the graph at the same
# places; watched, the host's reads of pinned memory at the graph break are still seen.
_PATCHED_UNDER_DYNAMO = r'''
import io, json, sys
import torch
watched = sys.argv[1] == "watched"
if watched:
    from harness.capture import events as E, torch_source as T
    buf = io.StringIO()
    sink = E.Sink(buf)
    stop = T.install(sink)
def f(t):
    listed = t.tolist()
    u = t.sin() + 1
    return u.cos() * len(listed) + float(t.numpy()[0])
x = torch.ones(4)
if watched:
    stop.capture.pinned[x.untyped_storage().data_ptr()] = {}
answers = [round(float(torch.compile(f, backend="eager")(x).sum()), 4) for _ in range(3)]
import torch._dynamo.utils as dynamo_utils
reads = []
if watched:
    stop()
    sink.flush()
    reads = [e[5]["op"] for e in map(json.loads, buf.getvalue().splitlines())
             if e[0] == "op" and e[2] == "host_read"]
print(json.dumps({"answers": answers, "frames": dict(dynamo_utils.counters["frames"]),
                  "breaks": sorted(k.split("\n")[0] for k in dynamo_utils.counters["graph_break"]),
                  "reads": reads}))
'''


def test_dynamo_compiles_a_watched_program_as_it_compiles_it_bare(tmp_path):
    """The methods the source patches are PyTorch's own inside a function torch.compile traces,
    and are kept from Dynamo at its graph breaks: Dynamo compiles as many frames watched as
    bare, with the same graph breaks (before, it compiled 32 frames here to the bare 3,
    tracing into the capture, and broke the graph elsewhere), and the capture still sees the
    program's reads at the break."""
    bare, watched = (json.loads(_run_in_process(tmp_path, _PATCHED_UNDER_DYNAMO, how).stdout)
                     for how in ("bare", "watched"))
    assert watched["answers"] == bare["answers"]
    assert watched["frames"] == bare["frames"] and watched["breaks"] == bare["breaks"]
    # Each call's tolist and numpy of the pinned argument, at the graph break.
    assert watched["reads"].count("host read") == 2 * len(watched["answers"]), watched["reads"]


def test_a_long_run_says_how_it_goes_while_it_runs(tmp_path):
    """A run that goes on for a while says, every GPURACE_PROGRESS_S seconds, how long it has
    run, the ops captured and the races so far (a soak of hours is never silent)."""
    prog = tmp_path / "slow.py"
    prog.write_text("import time, torch\nx = torch.ones(4)\ntime.sleep(2.0)\n"
                    "print(float(x.sum()))\n")
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--out", str(tmp_path / "out"), "--",
         TORCH_PYTHON, str(prog)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "GPURACE_PROGRESS_S": "0.5"})
    assert done.returncode == 0, done.stderr[-2000:]
    said = re.findall(r"run 1: (\d+) s, (\d+) ops captured, (\d+) race\(s\) so far",
                      done.stderr)
    assert len(said) >= 2, done.stderr[-2000:]
    assert [int(s[0]) for s in said] == sorted(int(s[0]) for s in said)
    assert all(s[2] == "0" for s in said)


def test_a_fault_of_the_watchs_own_analysis_never_harms_the_program(tmp_path):
    """The analysis meets an event it cannot take (here one the program writes into its own
    events file, as a buggy or newer source would): the program runs on to its end, as it
    would; the watch says what failed, keeps its traceback, and exits 3."""
    prog = tmp_path / "odd.py"
    prog.write_text(
        "import os, time\nfrom pathlib import Path\nimport torch\n"
        "events = Path(os.environ['GPURACE_WATCH_CHILDREN']).parent / 'events.jsonl'\n"
        "with open(events, 'a') as f:\n    f.write('[\"alloc\", \"d\"]\\n')\n"
        "time.sleep(1.0)\nprint('answer', float(torch.ones(3).sum()))\n")
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--format", "json", "--out",
         str(tmp_path / "out"), "--", TORCH_PYTHON, str(prog)], capture_output=True, text=True,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    (run,) = doc["watch"]["runs"]
    assert run["status"] == 0 and "answer 3.0" in Path(run["log"]).read_text()
    assert run["analysis_error"].startswith("TypeError"), run
    assert any("a fault of gpurace's, not the program's" in n for n in doc["watch_notes"])
    assert "Traceback" in Path(run["events"] + ".error.txt").read_text()


def _pytest_watched(folder: Path, tests: str) -> subprocess.CompletedProcess[str]:
    """pytest --gpurace-watch on the test file ``tests`` in ``folder``."""
    return subprocess.run(
        [TORCH_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--gpurace-watch", tests],
        capture_output=True, text=True, cwd=folder,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_a_fault_of_the_analysis_under_pytest_warns_and_never_fails_the_test(tmp_path):
    """pytest --gpurace-watch: an event the analysis cannot take (put in the watch's sink by
    the test, as a buggy source would) leaves the test's own verdict alone, with a warning
    that says the fault is gpurace's."""
    (tmp_path / "test_odd.py").write_text(
        "import torch\nfrom harness import pytest_plugin\n"
        "def test_odd():\n    x = torch.ones(3)\n"
        "    pytest_plugin._WATCH[0]._sink.emit(['alloc', 'd'])\n"
        "    assert float(x.sum()) == 3.0\n")
    done = _pytest_watched(tmp_path, "test_odd.py")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 passed" in done.stdout and "a fault of gpurace's, not the test's" in done.stdout


def test_what_the_watch_could_not_see_under_pytest_is_said_in_the_summary(tmp_path):
    """pytest --gpurace-watch: what the sources say as they stop (here a higher-order op whose
    inside was not seen, counted over the session's tests) is a section of pytest's summary,
    and the tests' verdicts are their own."""
    (tmp_path / "test_hop.py").write_text(
        "import torch\nfrom torch._higher_order_ops.out_dtype import out_dtype\n"
        "def mm(x):\n    return out_dtype(torch.ops.aten.mm.default, torch.int32, x, x)\n"
        "def test_one():\n    assert mm(torch.ones(4, 4, dtype=torch.int8)).sum() == 64\n"
        "def test_two():\n    assert mm(torch.ones(2, 2, dtype=torch.int8)).sum() == 8\n")
    done = _pytest_watched(tmp_path, "test_hop.py")
    assert done.returncode == 0, done.stdout[-3000:]
    section = done.stdout[done.stdout.index("gpurace watch ="):]
    assert "note: PyTorch: higher-order ops ran as they would unwatched; the ops they ran " \
           "inside were not seen: out_dtype (2x)" in section, done.stdout[-2000:]
    # And what the source said as it started: what it never sees, whatever the tests do; but
    # not what CuPy's or Triton's source cannot see, where they are installed and unused.
    assert "note: PyTorch: kernels that do not go through PyTorch's dispatcher" in section
    assert "cupy.cuda.Function launches" not in section
    assert "Triton: kernels launched other than" not in section
    assert "2 passed" in section


def test_a_watched_pytest_with_gpurace_installed_prints_no_warning_of_gpuraces(tmp_path):
    """`gpurace watch -- pytest` where gpurace is installed beside pytest (its pytest plugin
    found by entry point): pytest marks every installed plugin's packages for assertion
    rewriting, and the watch imported gpurace's before pytest started. The test run must
    print what it prints bare, with no 'Module already imported' warning of gpurace's."""
    (tmp_path / "test_plain.py").write_text(
        "import torch\n"
        "def test_the_plugin_is_found_by_its_entry_point(pytestconfig):\n"
        "    assert pytestconfig.pluginmanager.has_plugin('gpurace')\n"
        "    assert float(torch.ones(3).sum()) == 3.0\n")
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--out", str(tmp_path / "out"), "--",
         TORCH_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert "warning" not in done.stdout.lower(), done.stdout[-3000:]


def test_a_file_the_program_never_closed_is_written_as_a_normal_exit_writes_it(tmp_path):
    """A results file a module holds open to the end (never closed: the interpreter's exit
    flushes it) is written under the watch too, fresh and forked runs alike, though the
    watched process ends without the interpreter's teardown."""
    (tmp_path / "results.py").write_text(f"out = open({str(tmp_path / 'out.txt')!r}, 'a')\n")
    prog = tmp_path / "prog.py"
    prog.write_text("import torch, results\n"
                    "results.out.write('sum %s\\n' % float(torch.ones(3).sum()))\n")
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--runs", "2", "--format", "json",
         "--out", str(tmp_path / "w"), "--", TORCH_PYTHON, str(prog)], capture_output=True,
        text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["start"] for r in json.loads(done.stdout)["watch"]["runs"]] == ["fresh", "forked"]
    assert (tmp_path / "out.txt").read_text() == "sum 3.0\nsum 3.0\n"


def test_a_programs_threads_finish_before_it_exits_as_they_would_alone(tmp_path):
    """A non-daemon thread and an executor's queued work still running when the main module
    ends: a normal exit waits for them, and so does the watched one, fresh and forked; and
    what the watch does at the exit says nothing on the program's stderr (an object's own
    __class__ may warn: torch.distributed's deprecated reduce_op)."""
    prog = tmp_path / "threads.py"
    prog.write_text(
        "import threading, time\nfrom concurrent.futures import ThreadPoolExecutor\n"
        "import torch, torch.distributed\n"
        "def late():\n    time.sleep(0.5)\n    print('thread done', flush=True)\n"
        "threading.Thread(target=late).start()\n"
        "ThreadPoolExecutor(1).submit(lambda: (time.sleep(1.0), print('pool done', "
        "flush=True)))\nprint('main done', flush=True)\n")
    bare = subprocess.run([TORCH_PYTHON, str(prog)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert (bare.stdout, bare.stderr) == ("main done\nthread done\npool done\n", "")
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--runs", "2", "--format", "json",
         "--out", str(tmp_path / "w"), "--", TORCH_PYTHON, str(prog)], capture_output=True,
        text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert [r["start"] for r in doc["watch"]["runs"]] == ["fresh", "forked"]
    for run in doc["watch"]["runs"]:  # its output, and nothing of the watch's
        assert Path(run["log"]).read_text() == bare.stdout


def test_a_programs_exit_handlers_run_while_it_is_still_watched(tmp_path):
    """An exit handler's own work (a last checkpoint saved at exit) is the program's work:
    it runs after the main module, as it would alone, with the capture still on."""
    done, events = _boot(tmp_path, "import atexit, torch\n"
                                   "atexit.register(lambda: print('saved', "
                                   "float(torch.ones(4).sum())))\nprint('main')\n")
    assert done.returncode == 0 and done.stdout == "main\nsaved 4.0\n", done.stderr
    (stats,) = [e[1] for e in events if e[0] == "stats" and e[1]["source"] == "torch"]
    assert stats["ops"] >= 1, stats
