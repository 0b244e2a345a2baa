"""The CuPy source's own logic, without CuPy or a GPU: what CUDA source says of a kernel's
parameters, ElementwiseKernel parameter lists, array extents, the allocation map, one watched
call becoming one op (on a stand-in for CuPy), and the pinned array's host accesses.

Its hooks on real CuPy are tested on a GPU in test_capture_cupy_gpu.py.
"""

from __future__ import annotations

import io
import json
import sys
from types import SimpleNamespace
from typing import Any

import numpy
import pytest

from harness.capture import cupy_pinned
from harness.capture import cupy_source as cs
from harness.capture import extents as ex
from harness.capture import kernel_params as kp
from harness.capture.cupy_capture import CallPlan, CupyCapture
from harness.capture.events import Sink, Span
from harness.capture.kernel_params import READ, VALUE, WRITE

SAXPY = r'''
// a comment with a fake kernel: __global__ void saxpy(float* no)
extern "C" __global__ void __launch_bounds__(128, 2)
saxpy(const float* __restrict__ x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
/* __global__ void other(float* z) */
__global__ void other(float const* p, const float* const* table, float* const out,
                      CArray<float, 2> arr, const double v[], double w[]) {}
template<typename T>
__global__ void tmpl(const T* in, T* out) {}
'''


# -- kernel parameters ------------------------------------------------------------------------

def test_roles_of_a_raw_kernel_come_from_its_declaration() -> None:
    assert kp.kernel_param_roles(SAXPY, "saxpy") == (READ, WRITE, VALUE, VALUE)


def test_only_the_outermost_pointee_decides_and_arrays_are_pointers() -> None:
    assert kp.kernel_param_roles(SAXPY, "other") == (READ, READ, WRITE, VALUE, READ, WRITE)


@pytest.mark.parametrize("name", ["tmpl<float>", "_Z4tmplIfEvPKT_PS0_", "tmpl"])
def test_template_kernels_by_name_expression_or_mangled_name(name: str) -> None:
    assert kp.kernel_param_roles(SAXPY, name) == (READ, WRITE)


@pytest.mark.parametrize(("code", "name"), [
    (None, "saxpy"), ("", "saxpy"), (SAXPY, "missing"),
    ("__global__ void f(float* a) {}\n__global__ void f(const float* a, int n);", "f"),
])
def test_roles_are_unknown_where_the_source_does_not_say(code: str | None, name: str) -> None:
    assert kp.kernel_param_roles(code, name) is None


def test_a_kernel_with_no_parameters() -> None:
    assert kp.kernel_param_roles("__global__ void tick(void) {}", "tick") == ()
    assert kp.kernel_param_roles("__global__ void tick() {}", "tick") == ()


def test_params_split_at_top_level_commas_only() -> None:
    assert kp.split_params(" CArray<float, 2> a, int (*f)(int, int), float b ") == [
        "CArray<float, 2> a", "int (*f)(int, int)", "float b"]


@pytest.mark.parametrize(("decl", "role"), [
    ("const float* x", READ), ("float const *x", READ), ("float* const x", WRITE),
    ("const float* __restrict__ x", READ), ("void* p", WRITE), ("int n", VALUE),
    ("const int n", VALUE), ("float *x = nullptr", WRITE), ("volatile const int* f", READ),
])
def test_param_role(decl: str, role: str) -> None:
    assert kp.param_role(decl) == role


@pytest.mark.parametrize(("name", "ident"), [
    ("saxpy", "saxpy"), ("tmpl<float>", "tmpl"), ("ns::inner::go", "go"),
    ("_Z5saxpyPKfPf", "saxpy"), ("_ZN2ns4funcEv", "func"), ("9lives", "_9lives"),
    ("cupy-add", "cupy_add"), ("", "kernel"),
])
def test_kernel_identifier(name: str, ident: str) -> None:
    assert kp.kernel_identifier(name) == ident


def test_elementwise_params_follow_cupys_rules() -> None:
    ins = kp.elementwise_params("T x, raw T table, _non_const T acc", output=False)
    outs = kp.elementwise_params(" float32 y ", output=True)
    assert [(p.name, p.raw, p.written) for p in ins + outs] == [
        ("x", False, False), ("table", True, False), ("acc", False, True), ("y", False, True)]
    assert kp.elementwise_params("", output=False) == ()
    with pytest.raises(ValueError):
        kp.elementwise_params("T", output=False)


# -- bytes ------------------------------------------------------------------------------------

def test_extent_of_views() -> None:
    assert ex.extent(1000, (4,), (4,), 4) == (1000, 1016)
    assert ex.extent(1000, (2, 3), (40, 4), 4) == (1000, 1052)  # rows 40 bytes apart
    assert ex.extent(1012, (4,), (-4,), 4) == (1000, 1016)      # a reversed view
    assert ex.extent(1000, (3, 0), (4, 4), 4) is None
    assert ex.extent(1000, (), (), 8) == (1000, 1008)           # a 0-d array


def test_overlaps() -> None:
    assert ex.overlaps(Span("d", 0, 10), Span("d", 9, 1))
    assert not ex.overlaps(Span("d", 0, 10), Span("d", 10, 1))
    assert not ex.overlaps(Span("d", 0, 10), Span("h", 0, 10))
    assert ex.covered(Span("d", 5, 1), [Span("h", 0, 9), Span("d", 4, 2)])


def test_allocation_map() -> None:
    blocks = ex.AllocationMap()
    blocks.add(0x2000, 512, stream=7)
    blocks.add(0x1000, 256)
    assert blocks.find(0x2000 + 511) == ex.Block(0x2000, 512, 7)
    assert blocks.find(0x2000 + 512) is None and blocks.find(0x10) is None
    assert blocks.find(0x1000 + 100) == ex.Block(0x1000, 256, None)
    assert blocks.remove(0x2000) == ex.Block(0x2000, 512, 7)
    assert blocks.remove(0x2000) is None and blocks.find(0x2001) is None and len(blocks) == 1
    # A block handed out over one never freed replaces it; an empty block is still freed.
    blocks.add(0x1080, 64, stream=3)
    assert blocks.find(0x1000) is None and blocks.find(0x1080) == ex.Block(0x1080, 64, 3)
    blocks.add(0x5000, 0)
    assert blocks.find(0x5000) is None and blocks.remove(0x5000) == ex.Block(0x5000, 0, None)


@pytest.mark.parametrize(("key", "basic"), [
    (0, True), (slice(1, 3), True), ((0, slice(None), Ellipsis, None), True),
    (True, False), ([0, 1], False), ((0, [1]), False), (numpy.array([1]), False),
])
def test_basic_indexing(key: Any, basic: bool) -> None:
    assert ex.is_basic_index(key) is basic


def test_available_is_none_without_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    assert cs.available() is None


# -- one watched call, one op (on a stand-in for CuPy) ----------------------------------------

class _Base:
    """Enough of CuPy's _ndarray_base for the source's range code: a contiguous array."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.data = SimpleNamespace(ptr=ptr)
        self.nbytes = self.size = nbytes
        self.itemsize = 1
        self.shape, self.strides = (nbytes,), (1,)
        self.flags = SimpleNamespace(c_contiguous=True, f_contiguous=True)


class _Array(_Base):
    pass


STREAM = 0x77


def _fake_cupy() -> Any:
    runtime = SimpleNamespace(
        streamGetFlags=lambda sid: 1, pointerGetMemoryType=lambda ptr: 0, streamNonBlocking=1,
        memoryTypeHost=1, memoryTypeDevice=2, memoryTypeManaged=3, memcpyHostToHost=0,
        memcpyHostToDevice=1, memcpyDeviceToHost=2, memcpyDeviceToDevice=3)
    cuda = SimpleNamespace(runtime=runtime, MemoryPointer=type("MemoryPointer", (), {}),
                           get_current_stream=lambda: SimpleNamespace(ptr=STREAM))
    return SimpleNamespace(ndarray=_Array, cuda=cuda)


@pytest.fixture
def hooks() -> cs.CupyHooks:
    """The hooks of one install over a stand-in for CuPy, switched on but not put in."""
    out = io.StringIO()
    hooks = cs.CupyHooks.over(CupyCapture(Sink(out), _fake_cupy()))
    hooks.capture.active = True
    hooks.capture.events = lambda: (  # type: ignore[attr-defined]
        hooks.capture.sink.flush(), [json.loads(line) for line in out.getvalue().splitlines()])[1]
    return hooks


@pytest.fixture
def source(hooks: cs.CupyHooks) -> Any:
    return hooks.capture


def _ops(events: list[list[Any]]) -> list[list[Any]]:
    return [e[:5] for e in events if e[0] == "op"]


def test_a_call_reads_its_arrays_and_writes_what_it_returns_fresh(source: Any) -> None:
    a, b = _Array(0x1000, 64), _Array(0x2000, 64)

    def plan() -> CallPlan:
        return CallPlan(source.spans.arg_ranges((a,), {}), [], source.current_sid())

    assert source.run("f", "kernel:f", lambda x: b, (a,), {}, plan) is b
    events = source.events()
    assert events[0][:2] == ["stream", STREAM] and events[0][2]["blocking"] is False
    assert _ops(events) == [["op", STREAM, "kernel:f", [["d", 0x1000, 64]],
                             [["d", 0x2000, 64]]]]
    assert events[-1][5]["op"] == "f" and events[-1][5]["sync"] is False


def test_a_view_is_no_op_and_calls_inside_a_call_are_part_of_it(source: Any) -> None:
    a = _Array(0x1000, 64)
    view = _Array(0x1010, 16)
    plan = lambda: CallPlan(source.spans.arg_ranges((a,), {}), [], STREAM)  # noqa: E731

    def outer(x: Any) -> Any:
        return source.run("inner", "kernel:inner", lambda y: _Array(0x9000, 8), (x,), {}, plan)

    source.run("view", "kernel:view", lambda x: view, (a,), {}, plan)
    source.run("outer", "kernel:outer", outer, (a,), {}, plan)
    assert _ops(source.events()) == [["op", STREAM, "kernel:outer", [["d", 0x1000, 64]],
                                      [["d", 0x9000, 8]]]]


def test_an_event_recorded_inside_a_call_follows_its_op(source: Any,
                                                        hooks: cs.CupyHooks) -> None:
    """cupy.asarray from pageable memory: the pool's block, CuPy's pinned staging buffer
    filled on the host, the copy, then the event CuPy records to free the staging buffer."""
    result = _Array(0x5000, 32)

    def asarray() -> Any:
        hooks.memory.on_malloc(0x5000, 32, 512)
        hooks.memory.on_pinned_alloc(0x7000, 512)
        source.ordered()  # what the Stream.record hook does first
        source.emit(["record", 1, STREAM, None])
        return result

    source.run("cupy.asarray", "copy_htod", asarray, (), {}, lambda: CallPlan([], [], STREAM))
    kinds = [(e[0], e[2] if e[0] == "op" else None) for e in source.events()]
    assert kinds == [("stream", None), ("alloc", None), ("alloc", None), ("op", "host_write"),
                     ("op", "copy_htod"), ("record", None)]
    assert _ops(source.events()) == [
        ["op", None, "host_write", [], [["h", 0x7000, 512]]],
        ["op", STREAM, "copy_htod", [["h", 0x7000, 512]], [["d", 0x5000, 32]]]]


def test_a_result_made_after_an_early_op_gets_one_of_its_own(source: Any,
                                                             hooks: cs.CupyHooks) -> None:
    def call() -> Any:
        hooks.memory.on_malloc(0x5000, 8, 512)
        source.ordered()
        hooks.memory.on_free(0x5000)
        return _Array(0x6000, 16)

    source.run("nonzero", "kernel:nonzero", call, (), {}, lambda: CallPlan([], [], STREAM))
    assert _ops(source.events()) == [["op", STREAM, "kernel:nonzero", [], [["d", 0x5000, 8]]],
                                     ["op", STREAM, "kernel:nonzero", [], [["d", 0x6000, 16]]]]


def test_allocations_carry_their_stream_and_frees_forget_them(source: Any,
                                                              hooks: cs.CupyHooks) -> None:
    hooks.memory.on_malloc(0x5000, 100, 512)
    hooks.memory.on_free(0x5000)
    events = source.events()
    assert events[1] == ["alloc", "d", 0x5000, 100, {
        "what": "array", "name": None, "site": events[1][4]["site"], "stream": STREAM,
        "source": "cupy", "block": 512}]
    assert events[2][:3] == ["free", "d", 0x5000] and events[2][3]["streams"] == []
    assert source.spans.device.find(0x5000) is None


def test_kernel_arguments_by_role_and_unknown_roles_noted_once(source: Any,
                                                               hooks: cs.CupyHooks) -> None:
    x, y = _Array(0x1000, 64), _Array(0x2000, 64)
    hooks.memory.on_malloc(0x8000, 256, 256)
    found = hooks.kernels.kernel_accesses("k", (READ, WRITE, WRITE, VALUE),
                                          (x, y, 0x8000 + 16, 0x8000))
    assert found.reads == [Span("d", 0x1000, 64)]
    assert found.writes == [Span("d", 0x2000, 64), Span("d", 0x8010, 240)]  # rest of block
    for _ in range(2):
        found = hooks.kernels.kernel_accesses("k2", None, (x,))
    assert found.reads == [] and found.writes == [Span("d", 0x1000, 64)]
    notes = [e for e in source.events() if e[0] == "note"]
    assert len(notes) == 1 and "kernel k2" in notes[0][1]


def test_a_sync_writes_out_what_came_before(source: Any) -> None:
    source.emit(["record", 1, 0, None])
    source.on_sync(["sync_stream", 0, None])
    assert source.sink._events == []  # flushed before the host would wait


# -- the pinned array's host accesses ----------------------------------------------------------

class _Host:
    """A stand-in source that records the pinned array's host accesses."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[Any]]] = []
        self.busy = False

    def host_access(self, kind: str, arrays: Any) -> None:
        arrays = list(arrays)
        if arrays and not self.busy:
            self.seen.append((kind, [a.__array_interface__["data"][0] for a in arrays]))

    def host_call(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        self.busy, outer = True, self.busy
        try:
            return call(*args, **kwargs)
        finally:
            self.busy = outer


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> _Host:
    recorder = _Host()
    monkeypatch.setattr(cupy_pinned, "_HOST_SOURCE", recorder)
    return recorder


def test_pinned_array_writes_and_reads(host: _Host) -> None:
    pinned = numpy.zeros(8, dtype=numpy.float32).view(cupy_pinned.pinned_array_class())
    base = pinned.__array_interface__["data"][0]
    pinned[2:4] = 1.0
    pinned.fill(3)
    numpy.copyto(pinned, numpy.ones(8, dtype=numpy.float32))
    numpy.add(pinned, 1, out=pinned)
    total = pinned.sum()
    element = pinned[1]
    view = pinned[1:]
    pinned_class = cupy_pinned.PinnedArray
    assert isinstance(view, pinned_class) and not isinstance(pinned + 1, pinned_class)
    assert float(total) == 16.0 and float(element) == 2.0
    assert host.seen == [("host_write", [base + 8]), ("host_write", [base]),
                         ("host_write", [base]), ("host_read", [base]), ("host_write", [base]),
                         ("host_read", [base]), ("host_read", [base]), ("host_read", [base])]
