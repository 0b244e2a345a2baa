"""The CuPy source's raw pointers (harness.capture.cupy_pointers) on real CuPy objects, without
a GPU: the pointers ``ndarray.data`` and ``cupy.cuda.alloc`` hand out are watched pointers of
the same memory, and each copy or fill through one is said as its op before CuPy runs it (the
run itself needs a GPU: here CuPy raises, and the program sees CuPy's own error).
tests/test_engine_programs_gpu.py watches such copies race on a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks import python_with, run_printing_json

CUPY_PYTHON = python_with("cupy")

_PROGRAM = r'''
import ctypes, io, json
import cupy
from harness.capture import events as E
from harness.capture.source import load
buf = io.StringIO()
sink = E.Sink(buf)
stop = load("cupy").install(sink)
pointers = stop.capture.pointers
memory = cupy.cuda.memory
raw = memory.MemoryPointer(memory.UnownedMemory(0x7f0000001000, 4096, None, 0), 0)
src = memory.MemoryPointer(memory.UnownedMemory(0x7f0000009000, 4096, None, 0), 16)
dst, watched_src = pointers.watch(raw), pointers.watch(src)
same = [type(dst).__name__, isinstance(dst, memory.MemoryPointer), dst.ptr == raw.ptr,
        dst.mem is raw.mem, pointers.watch(raw) is dst, watched_src.ptr == src.ptr]
array = cupy.ndarray((16,), dtype=cupy.float32, memptr=raw)
same += [type(array.data).__name__, array.data is array.data, array.data.ptr == raw.ptr]
side = cupy.cuda.ExternalStream(0x5100)
errors = []
for call in (lambda: dst.copy_from_device(watched_src, 256),
             lambda: dst.copy_from_device_async(watched_src, 128, side),
             lambda: dst.copy_to_host(ctypes.c_void_p(0x5000), 64),
             lambda: dst.copy_from_host_async(0x6000, 32, stream=side),
             lambda: dst.copy_from(watched_src, 8),
             lambda: dst.memset(0, 512),
             lambda: dst.memset_async(1, 96, side)):
    try:
        call()
    except Exception as exc:  # no GPU here: CuPy's own error, as the program would see it
        errors.append(type(exc).__name__)
# Inside a watched call (as cupy.copyto copies through .data): the call's one op, not two.
from harness.capture.cupy_capture import CallPlan
capture = stop.capture.capture
def copyto():
    try:
        dst.copy_from_device_async(watched_src, 16, side)
    except Exception as exc:
        errors.append(type(exc).__name__)
capture.run("cupy.copyto", "copy_dtod", copyto, (), {},
            lambda: CallPlan([E.Span(E.DEVICE, src.ptr, 16)], [E.Span(E.DEVICE, raw.ptr, 16)], 0))
stop()
unwatched = type(pointers.watch(raw)).__name__
sink.flush()
events = [json.loads(line) for line in buf.getvalue().splitlines()]
ops = [[e[1], e[2], e[3], e[4], e[5]["op"], e[5]["sync"]] for e in events if e[0] == "op"]
print(json.dumps({"same": same, "errors": errors, "ops": ops, "unwatched": unwatched}))
'''


@pytest.mark.skipif(CUPY_PYTHON is None,
                    reason="no interpreter with CuPy here (GPURACE_TEST_PYTHON)")
def test_a_copy_through_a_watched_pointer_is_said_before_cupy_runs_it(tmp_path: Path) -> None:
    assert CUPY_PYTHON is not None
    got, _ = run_printing_json(CUPY_PYTHON, _PROGRAM, tmp_path)
    assert got["same"] == ["WatchedPointer", True, True, True, True, True,
                           "WatchedPointer", True, True]  # an array's data too, one object
    assert len(got["errors"]) == 8  # each call still ran CuPy's own code
    d, s, side = 0x7F0000001000, 0x7F0000009010, 0x5100
    assert got["ops"] == [
        [0, "copy_dtod", [["d", s, 256]], [["d", d, 256]], "MemoryPointer.copy_from_device",
         False],
        [side, "copy_dtod", [["d", s, 128]], [["d", d, 128]],
         "MemoryPointer.copy_from_device_async", False],
        # The host side is pageable here (no GPU to say it is pinned): the copy waits.
        [0, "copy_dtoh", [["d", d, 64]], [], "MemoryPointer.copy_to_host", True],
        [side, "copy_htod", [], [["d", d, 32]], "MemoryPointer.copy_from_host_async", True],
        [0, "copy_dtod", [["d", s, 8]], [["d", d, 8]], "MemoryPointer.copy_from", False],
        [0, "memset", [], [["d", d, 512]], "MemoryPointer.memset", False],
        [side, "memset", [], [["d", d, 96]], "MemoryPointer.memset_async", False],
        [0, "copy_dtod", [["d", s, 16]], [["d", d, 16]], "cupy.copyto", False]]
    assert got["unwatched"] == "MemoryPointer"  # stopped: the program's own pointer again
