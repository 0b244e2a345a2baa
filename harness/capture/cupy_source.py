"""The CuPy source: a CuPy program's stream work, said in the capture vocabulary.

CuPy's hot paths are Cython (``cdef`` classes, ``cpdef`` methods, C-level calls into the CUDA
runtime), so nothing below CuPy's Python surface can be patched from Python. This source hooks
what CuPy itself lets Python replace, and reports each call there as one op:

* ``cupy.ndarray`` is a Python subclass of the Cython ``_ndarray_base``: a method set on it
  overrides the base's, both for the program's calls and for CuPy's own ``cpdef`` calls (Cython
  looks for a Python override on heap types). So ``set``/``get`` (and through ``get``: ``item``,
  ``tolist``, ``bool(a)``, ``repr(a)``, ``cupy.asnumpy``), ``fill``, ``__setitem__``, the
  arithmetic, comparison and in-place operators and the kernel-launching methods are all seen.
* ``cupy.cuda.Stream``/``Event`` and the pinned pool's ``PooledPinnedMemory`` are Python classes:
  their methods are replaced in place (``record``, ``wait_event``, ``synchronize``, ``done``).
* The device pool reports every block it hands out and takes back to a ``cupy.cuda.MemoryHook``
  (hooks are per thread: the hook is put in each thread that starts after install, too).
* Module functions (``cupy.add`` and the other ufuncs, ``cupy.asarray``, ``cupy.copyto``,
  ``cupy.zeros``, the functions of ``cupy``, ``cupy.linalg``, ``cupy.fft``, ``cupy.random``, and
  ``cupy.cuda.runtime``'s memcpy, event and synchronize calls) are replaced by wrappers; kernel
  classes (``RawKernel``, ``RawModule``, ``ElementwiseKernel``, ``ReductionKernel``) and
  ``cupy.cuda.Device`` by Python subclasses, so what the program builds after install is seen.
* ``cupyx.empty_pinned`` and its kin return :data:`PinnedArray` views: a NumPy subclass whose
  reads and writes on the host (``staging[:] = ids``, ufuncs, NumPy functions) are host ops,
  since a stream's copy reads or writes those bytes behind the host's back.

One watched call is one op on the stream it was issued on: the arrays it was given are read,
its ``out=`` and in-place targets and the fresh arrays it returns are written. What CuPy does
inside a watched call (the kernels of ``cupy.sum``, a temporary) is that op, not ops of its own;
but an event CuPy records or a synchronize it makes inside the call is ordered after the op's
work, so the op is written out first (:meth:`_CupySource.commit`). A CUPTI layer, which would see
kernels CuPy launches from C, is not part of this source: :data:`BLIND_SPOTS` says, at install,
what the program may do that is not seen.

The pure functions at the top (CUDA parameter roles, ElementwiseKernel parameter lists, array
extents, the allocation map) need no CuPy and are tested without it.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns
from dataclasses import dataclass
from typing import Any

from harness.capture.amplify import Amplifier
from harness.capture.events import DEVICE, HOST, LEGACY_STREAM, PER_THREAD_STREAM, Sink
from harness.capture.sites import program_site, thread_name

SOURCE = "cupy"
HOOK_NAME = "gpurace"
READ, WRITE, VALUE = "read", "write", "value"
"""A kernel parameter's role: a pointer to const, any other pointer, a value."""

Access = list  # [space, address, nbytes], as the vocabulary writes it

BLIND_SPOTS = (
    "host reads and writes of pinned memory are seen on the NumPy arrays cupyx.empty_pinned, "
    "zeros_pinned and their _like kin return (and on CuPy's own staging buffers), not on other "
    "pinned memory nor through numpy.asarray(a), a.view(numpy.ndarray), ctypes or the buffer "
    "protocol",
    "MemoryPointer methods called directly (a.data.copy_from_host_async, memset_async, ...) "
    "and cupy.cuda.Function launches (RawKernel.kernel(...)) are not seen",
    "kernels CuPy launches from its compiled code are seen as the watched call that made them "
    "(its array arguments read, its outputs written); cupy.fuse, cupyx.jit kernels, "
    "RandomState methods and CUDA graph launches are not seen",
    "device blocks from allocators other than CuPy's default memory pool (MemoryAsyncPool, "
    "set_allocator(None), custom allocators) and pinned blocks outside the pinned memory pool "
    "are not seen",
    "memory hooks are per thread: allocations and frees in threads already running at install "
    "are not seen",
    "functions, ufuncs and kernels the program bound before install (from cupy import add; a "
    "RawKernel built before install) are not seen",
    "Device objects CuPy makes itself (a.device.synchronize()), stream host callbacks "
    "(launch_host_func, add_callback) and memcpy2D/3D/Peer calls are not seen",
)


# -- what CUDA source says about a kernel's parameters --------------------------------------

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_QUALIFIERS = re.compile(r"\b(?:__restrict__|__restrict|restrict|__grid_constant__|volatile)\b")
_CONST = re.compile(r"\bconst\b")
_OPEN, _CLOSE = "([{<", ")]}>"


def kernel_param_roles(code: str | None, name: str) -> tuple[str, ...] | None:
    """Each parameter's role in the ``__global__`` function ``name`` of the CUDA source
    ``code``: READ for a pointer to const (``const float*``, ``float const*``), WRITE for any
    other pointer, VALUE for a parameter passed by value. None where the source does not say
    (no source, no such kernel, declarations that disagree): the caller then counts the
    kernel's arrays as written, since a missed write hides a race and an extra one does not."""
    if not code:
        return None
    base = kernel_identifier(name)
    text = _COMMENTS.sub(" ", code)
    pattern = r"\b__global__\b[^;{}]*?\b" + re.escape(base) + r"\s*(?:<[^;{}()]*>)?\s*\("
    found: set[tuple[str, ...]] = set()
    for match in re.finditer(pattern, text):
        params = _balanced(text, match.end())
        if params is not None:
            found.add(tuple(param_role(p) for p in split_params(params)))
    return found.pop() if len(found) == 1 else None


def _balanced(text: str, start: int) -> str | None:
    """The text from ``start`` (just past an opening parenthesis) to its closing one."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def split_params(params: str) -> list[str]:
    """A C parameter list split at its top-level commas (``CArray<float, 2> a`` stays whole);
    ``()`` and ``(void)`` have no parameters."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(params):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(params[start:i])
            start = i + 1
    parts.append(params[start:])
    parts = [p.strip() for p in parts]
    return [] if parts in ([""], ["void"]) else parts


def param_role(decl: str) -> str:
    """READ, WRITE or VALUE for one parameter declaration. Only the pointee of the outermost
    pointer counts: ``float* const p`` writes through p, ``const float* const* p`` does not."""
    decl = _QUALIFIERS.sub(" ", decl.split("=", 1)[0])
    if "*" in decl:
        pointee = decl.rsplit("*", 1)[0].rsplit("*", 1)[-1]
        return READ if _CONST.search(pointee) else WRITE
    if "[" in decl:  # float a[]: a pointer to its element type
        return READ if _CONST.search(decl.split("[", 1)[0]) else WRITE
    return VALUE


def kernel_identifier(name: str) -> str:
    """The identifier a kernel is known by (what ``kernel:NAME`` says): its C++ name without
    namespace, template arguments or Itanium mangling (``_Z5saxpyPKfPf`` is ``saxpy``)."""
    ident = _demangled(name)
    if ident is None:
        ident = name.split("<", 1)[0].split("(", 1)[0].strip().rsplit("::", 1)[-1]
    ident = re.sub(r"\W", "_", ident) or "kernel"
    return "_" + ident if ident[0].isdigit() else ident


def _demangled(name: str) -> str | None:
    """The innermost name of an Itanium-mangled symbol (``_Z4funcIfEvPT_``, ``_ZN2ns4funcEv``)."""
    if not name.startswith("_Z"):
        return None
    i = 2
    nested = name.startswith("N", i)
    i += nested
    last = None
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        n = int(name[i:j])
        last, i = name[j:j + n], j + n
        if not nested:
            break
    return last or None


@dataclass(frozen=True)
class ElementwiseParam:
    """One parameter of an ElementwiseKernel/ReductionKernel: ``raw`` ones are indexed freely,
    ``written`` ones are outputs or ``_non_const`` inputs."""
    name: str
    raw: bool
    written: bool


def elementwise_params(text: str, output: bool) -> tuple[ElementwiseParam, ...]:
    """The parameters of an ElementwiseKernel's ``in_params`` or ``out_params`` string, read by
    CuPy's own rules (``[raw] [_non_const] TYPE NAME``, comma-separated)."""
    if not text.strip():
        return ()
    params = []
    for part in text.strip().split(","):
        tokens = part.split()
        if len(tokens) < 2:
            raise ValueError(f"not a kernel parameter: {part!r}")
        keywords = tokens[:-2]
        params.append(ElementwiseParam(tokens[-1], "raw" in keywords,
                                       output or "_non_const" in keywords))
    return tuple(params)


# -- bytes ------------------------------------------------------------------------------------

def extent(ptr: int, shape: Iterable[int], strides: Iterable[int],
           itemsize: int) -> tuple[int, int] | None:
    """The lowest address and the end of the bytes a strided view touches (negative strides
    included), or None for an empty view."""
    lo = hi = ptr
    for n, stride in zip(shape, strides):
        if n == 0:
            return None
        step = (n - 1) * stride
        if step < 0:
            lo += step
        else:
            hi += step
    return lo, hi + itemsize


def overlaps(a: Access, b: Access) -> bool:
    """Whether two accesses share a byte."""
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


def covered(access: Access, by: Iterable[Access]) -> bool:
    return any(overlaps(access, other) for other in by)


class AllocationMap:
    """The live blocks of one space, by start address: which block an address a kernel was
    handed as a bare integer lies in, and which stream a freed block belonged to."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._blocks: dict[int, tuple[int, int | None]] = {}
        self._lock = threading.Lock()

    def add(self, ptr: int, nbytes: int, stream: int | None = None) -> None:
        with self._lock:
            if ptr not in self._blocks:
                bisect.insort(self._starts, ptr)
            self._blocks[ptr] = (nbytes, stream)

    def remove(self, ptr: int) -> tuple[int, int | None] | None:
        """Forget the block at ``ptr``; its size and stream, or None if it was not known."""
        with self._lock:
            block = self._blocks.pop(ptr, None)
            if block is not None:
                del self._starts[bisect.bisect_left(self._starts, ptr)]
            return block

    def find(self, address: int) -> tuple[int, int] | None:
        """The start and size of the live block holding ``address``."""
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return None
            start = self._starts[i]
            nbytes = self._blocks[start][0]
            return (start, nbytes) if address < start + nbytes else None

    def __len__(self) -> int:
        return len(self._blocks)


def is_basic_index(key: Any) -> bool:
    """Whether ``a[key]`` is a view (ints, slices, ``...``, ``None``): then ``a[key] = v``
    writes only the view's bytes; any other key may write anywhere in ``a``."""
    parts = key if isinstance(key, tuple) else (key,)
    return all(p is None or p is Ellipsis or isinstance(p, slice)
               or (isinstance(p, int) and not isinstance(p, bool)) for p in parts)


# -- which calls launch what ---------------------------------------------------------------

_BINARY = {"add": "add", "sub": "subtract", "mul": "multiply", "matmul": "matmul",
           "truediv": "true_divide", "floordiv": "floor_divide", "mod": "remainder",
           "divmod": "divmod", "pow": "power", "lshift": "left_shift", "rshift": "right_shift",
           "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor"}
_COMPARE = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
            "gt": "greater", "ge": "greater_equal"}
_UNARY = {"neg": "negative", "pos": "positive", "abs": "absolute", "invert": "invert"}

# ndarray methods that may launch work; the number is where a positional `out` sits after self
# (Cython methods have no signature to read it from).
_METHODS: dict[str, int | None] = {
    "astype": None, "copy": None, "flatten": None, "ravel": None, "reshape": None,
    "take": 2, "repeat": None, "choose": 1, "argsort": None, "argpartition": None,
    "searchsorted": None, "nonzero": None, "compress": 2, "max": 1, "argmax": 1, "min": 1,
    "argmin": 1, "ptp": 1, "clip": 2, "round": 1, "trace": 4, "sum": 2, "cumsum": 2,
    "mean": 2, "var": 2, "std": 2, "prod": 2, "cumprod": 2, "all": 1, "any": 1, "conj": None,
    "conjugate": None, "dot": 1, "__getitem__": None, "__copy__": None, "__deepcopy__": None,
}
_INPLACE_METHODS = ("put", "sort", "partition", "scatter_add", "scatter_max", "scatter_min")
_COPY_METHODS = ("copy", "__copy__", "__deepcopy__")

# Module functions with a role of their own; every other public function of the watched
# modules is a generic op (reads its array arguments, writes its out= and fresh results).
_HOST_TO_DEVICE = ("array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray",
                   "require", "asarray_chkfinite", "asfarray", "frombuffer", "fromfile",
                   "fromiter", "fromstring", "fromfunction", "loadtxt", "genfromtxt", "load")
_MEMSET_FUNCTIONS = ("zeros", "zeros_like")
_COPY_FUNCTIONS = ("copy",)
_INPLACE_FUNCTIONS = ("put", "place", "putmask", "fill_diagonal", "put_along_axis", "shuffle")
_NOT_WATCHED = ("asnumpy", "empty", "empty_like", "get_array_module", "get_default_memory_pool",
                "get_default_pinned_memory_pool", "is_available", "show_config", "fuse",
                "from_dlpack", "fromDlpack", "shape", "ndim", "size", "result_type", "can_cast",
                "may_share_memory", "isscalar", "who", "printoptions", "set_printoptions",
                "get_printoptions")
_WATCHED_MODULES = ("cupy", "cupy.linalg", "cupy.fft", "cupy.random")


# -- the source -------------------------------------------------------------------------------

class _Frame:
    """One watched call in progress on this thread: what it was known to read and write before
    it ran, and the blocks the pools handed out while it ran (its outputs, its temporaries,
    CuPy's pinned staging buffers)."""

    __slots__ = ("label", "kind", "sid", "site", "reads", "writes", "allocs", "staging",
                 "committed", "covered")

    def __init__(self, label: str, kind: str, sid: int, site: str | None, reads: list[Access],
                 writes: list[Access]) -> None:
        self.label, self.kind, self.sid, self.site = label, kind, sid, site
        self.reads, self.writes = reads, writes
        self.allocs: list[Access] = []
        self.staging: list[Access] = []
        self.committed = False
        self.covered: list[Access] = []


_OPAQUE = _Frame("", "", 0, None, [], [])
_OPAQUE.committed = True
"""The frame of a copy whose op was written before it ran: nothing inside it is an op."""


class _CupySource:
    """The hooks of one install, the state they share, and their undoing."""

    def __init__(self, sink: Sink, cupy: Any) -> None:
        self.sink = sink
        self.cp = cupy
        self.active = False
        self._tls = threading.local()
        self._patches: list[tuple[Any, str, Any, bool]] = []
        self._device = AllocationMap()
        self._pinned = AllocationMap()
        self._seen_streams: set[int] = set()
        self._stream_sites: dict[int, str | None] = {}
        self._notes: set[Any] = set()
        self._hook: Any = None
        self._prev_profile: Any = None
        self._profile = self._thread_started  # one bound method, so `is` finds it again
        rt = cupy.cuda.runtime
        self._rt = {name: getattr(rt, name) for name in (
            "streamGetFlags", "pointerGetMemoryType", "streamNonBlocking", "memoryTypeHost",
            "memoryTypeDevice", "memoryTypeManaged", "memcpyHostToHost", "memcpyHostToDevice",
            "memcpyDeviceToHost", "memcpyDeviceToDevice")}
        self._base = cupy.ndarray.__base__  # the Cython _ndarray_base
        self._memptr = cupy.cuda.MemoryPointer
        import numpy
        self._np_ndarray = numpy.ndarray
        self.amplifier: Amplifier | None = None
        self._spin: Any = None  # the delay's kernel, built at the first delay
        self._delay_streams: dict[int, Any] = {}

    # -- install ----------------------------------------------------------------------------

    def install(self) -> None:
        """Put every hook in, note what none can see, and start reporting."""
        self.active = True
        for text in BLIND_SPOTS:
            self.note(text)
        for step in (self._hook_memory, self._hook_pinned, self._hook_streams,
                     self._hook_events, self._hook_ndarray, self._hook_kernels,
                     self._hook_device, self._hook_runtime, self._hook_functions,
                     self._hook_pinned_arrays):
            try:
                step()
            except Exception as exc:  # a CuPy that moved: watch the rest, say what is missing
                self.note(f"cupy source: {step.__name__[1:]} not installed ({exc!r})")

    def uninstall(self) -> None:
        """Take every hook out (what the program still holds, such as a RawKernel it built,
        falls back to CuPy's own behaviour) and write out what is buffered."""
        if not self.active:
            return
        self.active = False
        for target, name, original, own in reversed(self._patches):
            if own:
                setattr(target, name, original)
            else:
                delattr(target, name)
        self._patches.clear()
        if threading.getprofile() is self._profile:
            threading.setprofile(self._prev_profile)
        try:
            self.cp.cuda.memory_hook.get_memory_hooks().pop(HOOK_NAME, None)
        except Exception:
            pass
        global _HOST_SOURCE
        if _HOST_SOURCE is self:
            _HOST_SOURCE = None
        self.sink.flush()

    def patch(self, target: Any, name: str, value: Any) -> Any:
        """Set ``target.name`` to ``value``, remembering how to undo it; the original."""
        # A class's own entry is kept as it is (a property, a plain function) so undoing puts
        # back exactly that; an inherited one is undone by deleting the override.
        own = name in vars(target)
        original = vars(target)[name] if own else getattr(target, name)
        setattr(target, name, value)
        self._patches.append((target, name, original, own))
        return original

    # -- emitting -----------------------------------------------------------------------------

    def emit(self, event: list[Any]) -> None:
        if self.active:
            self.sink.emit(event)

    def note(self, text: str, key: Any = None) -> None:
        """A ``note`` event, once per ``key`` (the text itself by default)."""
        key = text if key is None else key
        if key not in self._notes:
            self._notes.add(key)
            self.emit(["note", text])

    def failed(self, where: str, exc: BaseException) -> None:
        """Our own bookkeeping broke on a call: the call still runs, unwatched, and says so."""
        self.note(f"cupy source: {where} not watched ({exc!r})", key=("failed", where))

    def sid(self, ptr: int) -> int:
        """The vocabulary's name of the stream with handle ``ptr``, announced the first time."""
        sid = LEGACY_STREAM if ptr in (0, 1) else ptr  # 1 is cudaStreamLegacy by its own name
        if sid not in self._seen_streams:
            self._seen_streams.add(sid)
            self._announce(sid)
        return sid

    def _announce(self, sid: int) -> None:
        if sid == LEGACY_STREAM:
            blocking, name = True, "legacy"
        elif sid == PER_THREAD_STREAM:
            blocking, name = True, "per-thread"  # not non-blocking: it orders with legacy
        else:
            name = None
            try:
                blocking = not self._rt["streamGetFlags"](sid) & self._rt["streamNonBlocking"]
            except Exception:  # a handle CUDA does not know: CuPy's default flag
                blocking = True
        site = self._stream_sites.get(sid) or program_site()
        self.emit(["stream", sid, {"blocking": bool(blocking), "legacy": sid == LEGACY_STREAM,
                                   "name": name, "site": site, "source": SOURCE}])

    def current_sid(self) -> int:
        return self.sid(self.cp.cuda.get_current_stream().ptr)

    def stream_sid(self, stream: Any) -> int:
        """The sid of a ``stream=`` argument (None: the current stream)."""
        return self.current_sid() if stream is None else self.sid(stream.ptr)

    def op(self, sid: int | None, kind: str, reads: list[Access], writes: list[Access],
           site: str | None, label: str, sync: bool = False) -> None:
        self.emit(["op", sid, kind, reads, writes, {"site": site, "op": label,
                                                    "thread": thread_name(),
                                                    "source": SOURCE, "sync": sync,
                                                    "t": perf_counter_ns()}])

    def before_wait(self) -> None:
        """The host is about to wait on the device: write everything out first, since a dead
        context or a hang is found right here."""
        self.sink.flush()

    # -- frames -------------------------------------------------------------------------------

    @property
    def frame(self) -> _Frame | None:
        return getattr(self._tls, "frame", None)

    def run(self, label: str, kind: str, call: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any], plan: Callable[[], tuple[list[Access], list[Access], int]],
            ) -> Any:
        """Run one watched call as one op. ``plan`` says, before the call, what it reads, what
        it is known to write and on which stream; the fresh arrays it returns are written too.
        A call inside another watched call is part of that one's op."""
        if not self.active or self.frame is not None:
            return call(*args, **kwargs)
        try:
            reads, writes, sid = plan()
            frame = _Frame(label, kind, sid, program_site(), reads, writes)
        except Exception as exc:
            self.failed(label, exc)
            return call(*args, **kwargs)
        if self.amplifier is not None:
            self.amplify(frame.site, kind, sid)
        self._tls.frame = frame
        try:
            result = call(*args, **kwargs)
        finally:
            self._tls.frame = None
        try:
            self.finish(frame, result)
        except Exception as exc:
            self.failed(label, exc)
        return result

    def ordered(self) -> None:
        """Something that follows the current call's work is about to be written (an event
        CuPy records to mark the work done, a synchronize, a copy of its result): write the
        call's op first."""
        frame = self.frame
        if frame is not None and not frame.committed:
            self.commit(frame, None)

    def commit(self, frame: _Frame, writes: list[Access] | None) -> None:
        """Write the frame's op. Early (``writes`` None), the blocks handed out so far stand for
        its outputs. CuPy's staging buffers are pinned blocks it filled on the host first."""
        if writes is None:
            writes = frame.writes + frame.allocs
        if not writes and not frame.staging:
            return
        frame.committed, frame.covered = True, writes
        for block in frame.staging:
            self.op(None, "host_write", [], [block], frame.site, frame.label)
        # Never said to wait: a copy CuPy makes inside a call goes through pinned memory or is
        # a fill, and a wait that did not happen would hide a race (its own waits are events).
        self.op(frame.sid, frame.kind, frame.reads + frame.staging, writes, frame.site,
                frame.label)

    def finish(self, frame: _Frame, result: Any) -> None:
        """The call returned: write its op with the fresh arrays it returned (an array that
        shares bytes with an argument is a view, not a write)."""
        known = frame.reads + frame.writes
        fresh = [r for r in self.ranges(result) if not covered(r, known)]
        if frame.committed:
            extra = [r for r in fresh if not covered(r, frame.covered)]
            if extra:
                self.op(frame.sid, frame.kind, frame.reads, extra, frame.site, frame.label)
            return
        self.commit(frame, frame.writes + fresh)

    # -- ranges -------------------------------------------------------------------------------

    def array_range(self, a: Any) -> Access | None:
        """The device bytes a CuPy array's view spans."""
        if a.size == 0:
            return None
        ptr = a.data.ptr
        flags = a.flags
        if flags.c_contiguous or flags.f_contiguous:
            return [DEVICE, ptr, a.nbytes]
        span = extent(ptr, a.shape, a.strides, a.itemsize)
        return None if span is None else [DEVICE, span[0], span[1] - span[0]]

    def ranges(self, obj: Any) -> Iterator[Access]:
        """The ranges of the CuPy arrays in ``obj`` (an array, or a list or tuple of them)."""
        if isinstance(obj, self._base):
            r = self.array_range(obj)
            if r is not None:
                yield r
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                if isinstance(item, self._base):
                    r = self.array_range(item)
                    if r is not None:
                        yield r

    def arg_ranges(self, args: Iterable[Any], kwargs: dict[str, Any]) -> list[Access]:
        found = [r for a in args for r in self.ranges(a)]
        found += [r for k, v in kwargs.items() if k != "out" for r in self.ranges(v)]
        return found

    def pinned_range(self, arr: Any) -> Access | None:
        """The bytes of a NumPy array if they are pinned host memory (a pageable array is the
        program's private copy: no stream touches it)."""
        if not isinstance(arr, self._np_ndarray) or arr.size == 0:
            return None
        if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
            return None
        ptr = arr.__array_interface__["data"][0]
        return [HOST, ptr, arr.nbytes] if self.is_pinned(ptr) else None

    def is_pinned(self, ptr: int) -> bool:
        try:
            return self._rt["pointerGetMemoryType"](ptr) == self._rt["memoryTypeHost"]
        except Exception:
            return False

    def pointer_range(self, arg: Any, role: str) -> Access | None:
        """What a kernel argument points at: an array's view, a MemoryPointer's block from it
        on, or, for a bare integer where the source declares a pointer, the rest of the live
        block it lies in."""
        if isinstance(arg, self._base):
            return self.array_range(arg)
        if isinstance(arg, self._memptr):
            mem = arg.mem
            end = mem.ptr + mem.size
            if end > arg.ptr:
                return [DEVICE, arg.ptr, end - arg.ptr]
            arg = arg.ptr
        if isinstance(arg, int) and not isinstance(arg, bool) and role in (READ, WRITE):
            block = self._device.find(arg)
            if block is not None:
                return [DEVICE, arg, block[0] + block[1] - arg]
        return None

    # -- memory -------------------------------------------------------------------------------

    def _hook_memory(self) -> None:
        source = self

        class Hook(self.cp.cuda.MemoryHook):
            name = HOOK_NAME

            def malloc_postprocess(self, **kw: Any) -> None:
                source.on_malloc(kw["mem_ptr"], kw["size"], kw["mem_size"])

            def free_preprocess(self, **kw: Any) -> None:
                source.on_free(kw["mem_ptr"])

        self._hook = Hook()
        self._hook_thread()
        self._prev_profile = threading.getprofile()
        threading.setprofile(self._profile)

    def _hook_thread(self) -> None:
        # Setting the entry directly, not `with hook:`, so a thread that had it keeps one.
        self.cp.cuda.memory_hook.get_memory_hooks()[HOOK_NAME] = self._hook

    def _thread_started(self, frame: Any, event: str, arg: Any) -> None:
        """The first thing a thread started after install runs: hand its profiler back, and put
        the memory hook in it (CuPy's hooks are per thread)."""
        sys.setprofile(self._prev_profile)
        if self.active:
            try:
                self._hook_thread()
            except Exception as exc:
                self.failed("a new thread's memory hook", exc)

    def on_malloc(self, ptr: int, size: int, block: int) -> None:
        if not self.active or not ptr:
            return
        try:
            sid = self.current_sid()
            self._device.add(ptr, size, sid)
            self.emit(["alloc", DEVICE, ptr, size, {"what": "array", "name": None,
                                                    "site": program_site(), "stream": sid,
                                                    "source": SOURCE, "block": block}])
            frame = self.frame
            if frame is not None and frame is not _OPAQUE:
                frame.allocs.append([DEVICE, ptr, size])
        except Exception as exc:
            self.failed("a device allocation", exc)

    def on_free(self, ptr: int) -> None:
        if not self.active or not ptr:
            return
        try:
            self._device.remove(ptr)
            self.emit(["free", DEVICE, ptr, {"site": program_site(), "streams": [],
                                             "source": SOURCE}])
            frame = self.frame
            if frame is not None and frame is not _OPAQUE:
                frame.allocs = [a for a in frame.allocs if a[1] != ptr]
        except Exception as exc:
            self.failed("a device free", exc)

    def _hook_pinned(self) -> None:
        """The pinned pool hands out a PooledPinnedMemory per allocation and takes the block
        back when it is freed, to hand out again at once (no stream order: alloc stream None)."""
        pooled = self.cp.cuda.pinned_memory.PooledPinnedMemory
        source = self
        init, free = pooled.__init__, pooled.__dict__["free"]

        def watched_init(mem: Any, *args: Any, **kwargs: Any) -> None:
            init(mem, *args, **kwargs)
            source.on_pinned_alloc(mem.ptr, mem.size)

        def watched_free(mem: Any) -> None:
            if mem.ptr:
                source.on_pinned_free(mem.ptr)
            free(mem)

        self.patch(pooled, "__init__", watched_init)
        self.patch(pooled, "free", watched_free)
        self.patch(pooled, "__del__", watched_free)

    def on_pinned_alloc(self, ptr: int, size: int) -> None:
        if not self.active or not ptr:
            return
        try:
            self._pinned.add(ptr, size)
            self.emit(["alloc", HOST, ptr, size, {"what": "pinned buffer", "name": None,
                                                  "site": program_site(), "stream": None,
                                                  "source": SOURCE}])
            frame = self.frame
            if frame is not None and frame is not _OPAQUE:
                frame.staging.append([HOST, ptr, size])
        except Exception as exc:
            self.failed("a pinned allocation", exc)

    def on_pinned_free(self, ptr: int) -> None:
        if not self.active:
            return
        try:
            self._pinned.remove(ptr)
            self.emit(["free", HOST, ptr, {"site": program_site(), "streams": [],
                                           "source": SOURCE}])
        except Exception as exc:
            self.failed("a pinned free", exc)

    def _hook_pinned_arrays(self) -> None:
        """cupyx's pinned constructors hand out :class:`PinnedArray` views, whose NumPy reads
        and writes are host ops (the module's own functions call ``empty_pinned`` through the
        module, so ``zeros_pinned`` and ``zeros_like_pinned`` are covered by the first two)."""
        import cupyx
        import cupyx._pinned_array as pinned

        pinned_class = _pinned_array_class()
        for name in ("empty_pinned", "empty_like_pinned"):
            original = getattr(pinned, name)

            def make(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
                return _original(*args, **kwargs).view(pinned_class)

            watched = functools.wraps(original)(make)
            self.patch(pinned, name, watched)
            self.patch(cupyx, name, watched)
        global _HOST_SOURCE
        _HOST_SOURCE = self

    def host_access(self, kind: str, arrays: Iterable[Any]) -> None:
        """The program's host code read or wrote pinned arrays: one host op. Accesses CuPy
        makes inside a watched call (``numpy.ascontiguousarray`` in ``set``) are its own."""
        if not self.active or self.frame is not None or getattr(self._tls, "host", False):
            return
        try:
            spans = [r for a in arrays if (r := self.host_range(a)) is not None]
            if spans:
                reads, writes = ([], spans) if kind == "host_write" else (spans, [])
                self.op(None, kind, reads, writes, program_site(), "numpy")
        except Exception as exc:
            self.failed("a pinned array's host access", exc)

    def host_range(self, arr: Any) -> Access | None:
        if arr.size == 0:
            return None
        ptr = arr.__array_interface__["data"][0]
        span = extent(ptr, arr.shape, arr.strides, arr.itemsize)
        return None if span is None else [HOST, span[0], span[1] - span[0]]

    def host_call(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run NumPy's own work on pinned arrays without reporting its inner steps again."""
        tls = self._tls
        outer = getattr(tls, "host", False)
        tls.host = True
        try:
            return call(*args, **kwargs)
        finally:
            tls.host = outer

    # -- streams and events ---------------------------------------------------------------

    def _hook_streams(self) -> None:
        stream_mod = self.cp.cuda.stream
        base, stream_cls = stream_mod._BaseStream, stream_mod.Stream
        source = self
        init = stream_cls.__init__
        record, wait_event = base.record, base.wait_event
        synchronize, done = base.synchronize, base.done

        def watched_init(stream: Any, *args: Any, **kwargs: Any) -> None:
            init(stream, *args, **kwargs)
            source.on_stream_created(stream.ptr)

        def watched_record(stream: Any, event: Any = None) -> Any:
            if not source.active:
                return record(stream, event)
            source.ordered()
            event = record(stream, event)
            source.emit(["record", event.ptr, source.sid(stream.ptr), program_site()])
            return event

        def watched_wait(stream: Any, event: Any) -> None:
            wait_event(stream, event)
            if source.active:
                source.emit(["wait", event.ptr, source.sid(stream.ptr), program_site()])

        def watched_sync(stream: Any) -> None:
            source.on_sync(["sync_stream", source.sid(stream.ptr), program_site()])
            synchronize(stream)

        def watched_done(stream: Any) -> bool:
            finished = done.fget(stream)
            if finished and source.active:
                # The vocabulary has no stream query: a stream seen idle orders the host after
                # its work exactly as a synchronize that returned at once would.
                source.emit(["sync_stream", source.sid(stream.ptr), program_site()])
            return finished

        self.patch(stream_cls, "__init__", watched_init)
        self.patch(base, "record", watched_record)
        self.patch(base, "wait_event", watched_wait)
        self.patch(base, "synchronize", watched_sync)
        self.patch(base, "done", property(watched_done, doc=done.__doc__))

    def on_stream_created(self, ptr: int) -> None:
        """A stream the program made: where (its announcement names that line), and forget a
        destroyed stream that had the same handle."""
        if ptr not in (0, 1, PER_THREAD_STREAM):
            self._stream_sites[ptr] = program_site()
            self._seen_streams.discard(ptr)

    def on_sync(self, event: list[Any]) -> None:
        """A host wait: the current call's op, the wait, then everything written out. Inside a
        copy that already said it waits (its op's ``sync``), only the writing out."""
        if not self.active:
            return
        if self.frame is not _OPAQUE:
            self.ordered()
            self.emit(event)
        self.before_wait()

    def _hook_events(self) -> None:
        event_cls = self.cp.cuda.Event
        source = self
        record, synchronize, done = event_cls.record, event_cls.synchronize, event_cls.done

        def watched_record(event: Any, stream: Any = None) -> None:
            if not source.active:
                return record(event, stream)
            source.ordered()
            record(event, stream)
            source.emit(["record", event.ptr, source.stream_sid(stream), program_site()])

        def watched_sync(event: Any) -> None:
            source.on_sync(["sync_event", event.ptr, program_site()])
            synchronize(event)

        def watched_done(event: Any) -> bool:
            finished = done.fget(event)
            if source.active:
                source.emit(["query", event.ptr, bool(finished), program_site()])
            return finished

        self.patch(event_cls, "record", watched_record)
        self.patch(event_cls, "synchronize", watched_sync)
        self.patch(event_cls, "done", property(watched_done, doc=done.__doc__))

    def _hook_device(self) -> None:
        base = self.cp.cuda.Device
        source = self

        class Device(base):
            __doc__ = base.__doc__

            def synchronize(self) -> None:
                source.on_sync(["sync_device", program_site()])
                return base.synchronize(self)

        Device.__module__, Device.__qualname__ = base.__module__, base.__qualname__
        self.patch(self.cp.cuda, "Device", Device)
        self.patch(self.cp.cuda.device, "Device", Device)

    # -- delays -----------------------------------------------------------------------------

    def amplify(self, site: str | None, kind: str, sid: int | None) -> None:
        """Queue the delay the amplifier wants before this op, on the op's stream: a spin on
        the GPU's global timer, so its length does not follow the SM clock."""
        assert self.amplifier is not None
        delay = self.amplifier.wants(site, kind)
        if delay is None or sid is None:
            return
        try:
            if self._spin is None:
                self._spin = self.cp.RawKernel(_SPIN_CODE, "gpurace_delay")
            stream = self._delay_streams.get(sid)
            if stream is None:
                stream = self._delay_streams[sid] = self.cp.cuda.ExternalStream(sid)
            import numpy
            ns = numpy.uint64(int(delay.us * 1000))
            self.opaque(self._spin, (1,), (1,), (ns,), stream=stream)
        except Exception as exc:  # a delay that cannot be queued must not stop the program
            self.amplifier.failed(delay, repr(exc))
            return
        self.amplifier.queued(delay, sid)

    # -- copies -----------------------------------------------------------------------------

    def copy_op(self, label: str, kind: str, sid: int, reads: list[Access],
                writes: list[Access], sync: bool) -> None:
        """A copy whose op is known before it runs: written first (after the current call's
        op), and everything written out before it runs if it waits."""
        self.ordered()
        if reads or writes:
            site = program_site()
            if self.amplifier is not None:
                self.amplify(site, kind, sid)
            self.op(sid, kind, reads, writes, site, label, sync)
        if sync:
            self.before_wait()

    def opaque(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a copy whose op was written: nothing inside it is reported again."""
        outer = self.frame
        self._tls.frame = _OPAQUE
        try:
            return call(*args, **kwargs)
        finally:
            self._tls.frame = outer

    def get(self, original: Callable[..., Any], a: Any, stream: Any = None, order: str = "C",
            out: Any = None, blocking: bool = True) -> Any:
        """``ndarray.get``: a copy to the host; waits when ``blocking``, and always when the
        host side is pageable (the driver copies it through a staging buffer of its own)."""
        if not self.active or (out is not None and not isinstance(out, self._np_ndarray)):
            return original(a, stream, order, out, blocking)  # CuPy raises, or not watching
        try:
            src = self.array_range(a)
            dst = None if out is None else self.pinned_range(out)
            sync = blocking or dst is None
            if src is not None:
                self.copy_op("ndarray.get", "copy_dtoh", self.stream_sid(stream), [src],
                             [] if dst is None else [dst], sync)
        except Exception as exc:
            self.failed("ndarray.get", exc)
        return self.opaque(original, a, stream, order, out, blocking)

    def set(self, original: Callable[..., Any], a: Any, arr: Any, stream: Any = None) -> Any:
        """``ndarray.set``: a copy from the host, waited for unless the host side is pinned."""
        flags = a.flags
        if not self.active or not isinstance(arr, self._np_ndarray) or (
                arr.dtype != a.dtype or arr.shape != a.shape) or not (
                flags.c_contiguous or flags.f_contiguous):
            return original(a, arr, stream)  # CuPy raises, or nothing to watch
        try:
            dst = self.array_range(a)
            same_order = arr.flags.c_contiguous if flags.c_contiguous else arr.flags.f_contiguous
            src = self.pinned_range(arr) if same_order else None  # else a pageable copy
            if dst is not None:
                self.copy_op("ndarray.set", "copy_htod", self.stream_sid(stream),
                             [] if src is None else [src], [dst], src is None)
        except Exception as exc:
            self.failed("ndarray.set", exc)
        return self.opaque(original, a, arr, stream)

    # -- ndarray ------------------------------------------------------------------------------

    def _hook_ndarray(self) -> None:
        nd, base = self.cp.ndarray, self._base
        source = self
        get, set_, fill, setitem = base.get, base.set, base.fill, base.__setitem__

        def watched_get(a: Any, stream: Any = None, order: str = "C", out: Any = None,
                        blocking: bool = True) -> Any:
            return source.get(get, a, stream, order, out, blocking)

        def watched_set(a: Any, arr: Any, stream: Any = None) -> Any:
            return source.set(set_, a, arr, stream)

        def watched_fill(a: Any, value: Any) -> None:
            # CuPy memsets a contiguous array filled with zero, and runs a kernel otherwise.
            kind = "memset" if _is_zero(value) and a.flags.c_contiguous else "kernel:fill"
            return source.run("ndarray.fill", kind, fill, (a, value), {},
                              lambda: (source.arg_ranges((value,), {}),
                                       source.writes_of(a), source.current_sid()))

        def watched_setitem(a: Any, key: Any, value: Any) -> None:
            return source.run("ndarray.__setitem__", source.setitem_kind(value), setitem,
                              (a, key, value), {}, lambda: source.setitem_plan(a, key, value))

        for name, watched, original in (("get", watched_get, get), ("set", watched_set, set_),
                                        ("fill", watched_fill, fill),
                                        ("__setitem__", watched_setitem, setitem)):
            self.patch(nd, name, _named(watched, name, original))
        for name, out_at in _METHODS.items():
            if hasattr(base, name):
                kind = "copy_dtod" if name in _COPY_METHODS else "kernel:" + name.strip("_")
                self.patch(nd, name, self.method(name, kind, getattr(base, name), out_at,
                                                 False))
        for name in _INPLACE_METHODS:
            if hasattr(base, name):
                self.patch(nd, name, self.method(name, "kernel:" + name, getattr(base, name),
                                                 None, True))
        operators = [(f"__{s}__", u, False) for s, u in {**_BINARY, **_COMPARE, **_UNARY}.items()]
        operators += [(f"__r{s}__", u, False) for s, u in _BINARY.items()]
        operators += [(f"__i{s}__", u, True) for s, u in _BINARY.items()]
        for dunder, ufunc, inplace in operators:
            if hasattr(base, dunder):  # the reflected ones are the interpreter's slot wrappers
                self.patch(nd, dunder, self.method(dunder, "kernel:" + ufunc,
                                                   getattr(base, dunder), None, inplace))

    def method(self, name: str, kind: str, original: Callable[..., Any], out_at: int | None,
               inplace: bool) -> Callable[..., Any]:
        """A watched ndarray method: reads self and its array arguments, writes its ``out``
        (keyword, or positional at ``out_at``), self when ``inplace``, and fresh results."""
        source, label = self, "ndarray." + name

        def watched(a: Any, *args: Any, **kwargs: Any) -> Any:
            def plan() -> tuple[list[Access], list[Access], int]:
                out = kwargs.get("out")
                rest = list(args)
                if out is None and out_at is not None and len(args) > out_at:
                    out = rest.pop(out_at)
                writes = list(source.ranges(out))
                if inplace:
                    writes += source.writes_of(a)
                reads = source.arg_ranges((a, *rest), kwargs)
                return reads, writes, source.current_sid()

            return source.run(label, kind, original, (a, *args), kwargs, plan)

        return _named(watched, name, original)

    def writes_of(self, a: Any) -> list[Access]:
        r = self.array_range(a)
        return [] if r is None else [r]

    def setitem_kind(self, value: Any) -> str:
        return "copy_htod" if isinstance(value, self._np_ndarray) else "kernel:setitem"

    def setitem_plan(self, a: Any, key: Any, value: Any) -> tuple[list[Access], list[Access],
                                                                  int]:
        """``a[key] = value`` writes the view ``a[key]`` (the whole of ``a`` for an advanced
        key, which may land anywhere in it) and reads ``value`` and any index arrays."""
        target = self._base.__getitem__(a, key) if is_basic_index(key) else a
        reads = self.arg_ranges((value, *(key if isinstance(key, tuple) else (key,))), {})
        host = self.pinned_range(value)
        if host is not None and value.dtype == a.dtype:
            reads.append(host)
        return reads, self.writes_of(target), self.current_sid()

    # -- kernels ------------------------------------------------------------------------------

    def _hook_kernels(self) -> None:
        core = self.cp._core
        raw = self.raw_kernel_class(core.RawKernel)
        module = self.raw_module_class(core.RawModule, raw)
        elementwise = self.elementwise_class(core.ElementwiseKernel)
        reduction = self.reduction_class(self.cp._core._reduction.ReductionKernel)
        for namespace in (self.cp, core):
            self.patch(namespace, "RawKernel", raw)
            self.patch(namespace, "RawModule", module)
            self.patch(namespace, "ElementwiseKernel", elementwise)
            if hasattr(namespace, "ReductionKernel"):
                self.patch(namespace, "ReductionKernel", reduction)

    def raw_kernel_class(self, base: type) -> type:
        """``cupy.RawKernel`` as a subclass whose launches are ops; the roles of its parameters
        come from its CUDA source, read once."""
        source = self

        class RawKernel(base):
            __doc__ = base.__doc__

            def __init__(self, code: str, name: str, *args: Any, **kwargs: Any) -> None:
                super().__init__(code, name, *args, **kwargs)
                self._gpurace_roles = kernel_param_roles(code, name)

            def __call__(self, grid: Any, block: Any, args: Any, **kwargs: Any) -> Any:
                return source.raw_call(self, base.__call__, grid, block, args, kwargs)

        RawKernel.__module__, RawKernel.__qualname__ = "cupy", "RawKernel"
        return RawKernel

    def raw_module_class(self, base: type, kernel_class: type) -> type:
        """``cupy.RawModule`` whose ``get_function`` hands out watched RawKernels (CuPy builds
        its own from C, so each is cloned into the subclass through its pickling state)."""
        class RawModule(base):
            __doc__ = base.__doc__

            def get_function(self, name: str) -> Any:
                kernel = super().get_function(name)
                clone = kernel_class.__new__(kernel_class)
                clone.__setstate__(kernel.__getstate__())
                clone._gpurace_roles = kernel_param_roles(self.code, name)
                return clone

        RawModule.__module__, RawModule.__qualname__ = "cupy", "RawModule"
        return RawModule

    def raw_call(self, kernel: Any, call: Callable[..., Any], grid: Any, block: Any, args: Any,
                 kwargs: dict[str, Any]) -> Any:
        """A RawKernel launch: written after it is issued (a launch that raised issued
        nothing). Pointers to const are read, other pointers written."""
        if not self.active or self.frame is not None:
            return call(kernel, grid, block, args, **kwargs)
        try:
            sid, site = self.stream_sid(kwargs.get("stream")), program_site()
            name = kernel_identifier(kernel.name)
        except Exception as exc:
            self.failed("RawKernel", exc)
            return call(kernel, grid, block, args, **kwargs)
        if self.amplifier is not None:
            self.amplify(site, "kernel:" + name, sid)
        result = call(kernel, grid, block, args, **kwargs)
        try:
            reads, writes = self.kernel_accesses(name, getattr(kernel, "_gpurace_roles", None),
                                                 tuple(args))
            self.op(sid, "kernel:" + name, reads, writes, site, f"RawKernel({kernel.name})")
        except Exception as exc:
            self.failed("RawKernel", exc)
        return result

    def kernel_accesses(self, name: str, roles: tuple[str, ...] | None,
                        args: tuple[Any, ...]) -> tuple[list[Access], list[Access]]:
        """The reads and writes of a raw launch's arguments, by the parameters' roles."""
        if roles is not None and len(roles) != len(args):
            roles = None
        if roles is None:
            self.note(f"kernel {name}: its parameters' read/write roles are unknown (no CUDA "
                      f"source to read them from); every array argument is counted as written",
                      key=("roles", name))
        reads: list[Access] = []
        writes: list[Access] = []
        for i, arg in enumerate(args):
            role = WRITE if roles is None else roles[i]
            r = self.pointer_range(arg, role)
            if r is not None:
                (reads if role == READ else writes).append(r)
        return reads, writes

    def elementwise_class(self, base: type) -> type:
        """``cupy.ElementwiseKernel`` as a subclass whose calls are ops."""
        source = self

        class ElementwiseKernel(base):
            __doc__ = base.__doc__

            def __init__(self, in_params: str, out_params: str, operation: str,
                         name: str = "kernel", *args: Any, **kwargs: Any) -> None:
                super().__init__(in_params, out_params, operation, name, *args, **kwargs)
                self._gpurace_params = _kernel_params(in_params, out_params)

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return source.elementwise_call(self, base.__call__, args, kwargs)

        ElementwiseKernel.__module__, ElementwiseKernel.__qualname__ = "cupy", "ElementwiseKernel"
        return ElementwiseKernel

    def reduction_class(self, base: type) -> type:
        """``cupy.ReductionKernel`` as a subclass whose calls are ops."""
        source = self

        class ReductionKernel(base):
            __doc__ = base.__doc__

            def __init__(self, in_params: str, out_params: str, *args: Any,
                         **kwargs: Any) -> None:
                super().__init__(in_params, out_params, *args, **kwargs)
                self._gpurace_params = _kernel_params(in_params, out_params)

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return source.elementwise_call(self, base.__call__, args, kwargs)

        ReductionKernel.__module__, ReductionKernel.__qualname__ = "cupy", "ReductionKernel"
        return ReductionKernel

    def elementwise_call(self, kernel: Any, call: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
        """An ElementwiseKernel/ReductionKernel call: arguments by their parameters' roles,
        ``out=`` and fresh outputs written."""
        def plan() -> tuple[list[Access], list[Access], int]:
            params = getattr(kernel, "_gpurace_params", None) or ()
            reads: list[Access] = []
            writes = list(self.ranges(kwargs.get("out")))
            for i, arg in enumerate(args):
                written = params[i].written if i < len(params) else True  # unknown: written
                (writes if written else reads).extend(self.ranges(arg))
            return reads, writes, self.stream_sid(kwargs.get("stream"))

        name = kernel_identifier(kernel.name)
        return self.run(f"{type(kernel).__name__}({kernel.name})", "kernel:" + name, call,
                        (kernel, *args), kwargs, plan)

    # -- module functions -------------------------------------------------------------------

    def _hook_functions(self) -> None:
        import importlib

        for module_name in _WATCHED_MODULES:
            module = importlib.import_module(module_name)
            for name in dir(module):
                if name.startswith("_") or name in _NOT_WATCHED:
                    continue
                value = getattr(module, name)
                wrapped = self.function(module_name, name, value)
                if wrapped is not None:
                    self.patch(module, name, wrapped)

    def function(self, module_name: str, name: str, value: Any) -> Any:
        """The watched stand-in for one module attribute, or None to leave it alone."""
        label = f"{module_name}.{name}"
        if isinstance(value, self.cp.ufunc):
            return _UfuncProxy(self, value, label)
        if module_name == "cupy" and name == "copyto":
            return self.copyto_wrapper(value)
        if callable(value) and type(value).__name__ == "_GUFunc":  # cupy.matmul
            return _CallProxy(self, value, label, "kernel:" + name, None)
        home = str(getattr(value, "__module__", None) or "")
        if not inspect.isfunction(value) or not home.startswith(("cupy", "cupyx")):
            return None  # NumPy's own functions re-exported, classes, constants
        if name in _HOST_TO_DEVICE and module_name == "cupy":
            return self.host_to_device_wrapper(value, label)
        kind = ("memset" if name in _MEMSET_FUNCTIONS else
                "copy_dtod" if name in _COPY_FUNCTIONS else "kernel:" + name)
        out_at = _out_position(value)
        return _wraps(value, _CallProxy(self, value, label, kind, out_at,
                                        inplace=name in _INPLACE_FUNCTIONS))

    def copyto_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``cupy.copyto(dst, src, casting, where)``: a copy between arrays, a fill from a
        scalar, a masked kernel with ``where``."""
        source = self

        @functools.wraps(original)
        def copyto(dst: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
            where = kwargs.get("where", args[1] if len(args) > 1 else None)
            array = isinstance(src, source._base)
            kind = "copy_dtod" if array and where is None else "kernel:copyto"
            return source.run("cupy.copyto", kind, original, (dst, src, *args), kwargs,
                              lambda: (source.arg_ranges((src, where), {}),
                                       source.writes_of(dst), source.current_sid()))

        return copyto

    def host_to_device_wrapper(self, original: Callable[..., Any],
                               label: str) -> Callable[..., Any]:
        """``cupy.asarray`` and its kin: from host data, a copy to the device (through a
        pinned staging buffer CuPy fills first, unless the data is pinned already); from a
        CuPy array, a device copy or none."""
        source = self

        @functools.wraps(original)
        def to_device(obj: Any, *args: Any, **kwargs: Any) -> Any:
            def plan() -> tuple[list[Access], list[Access], int]:
                reads = list(source.ranges(obj))
                dtype = kwargs.get("dtype", args[0] if args else None)
                host = source.pinned_range(obj)
                if host is not None and (dtype is None or obj.dtype == dtype):
                    reads.append(host)  # CuPy copies straight from it
                return reads, [], source.current_sid()

            on_device = isinstance(obj, source._base) or hasattr(
                obj, "__cuda_array_interface__") or (isinstance(obj, (list, tuple)) and any(
                    isinstance(x, source._base) for x in obj))
            kind = "copy_dtod" if on_device else "copy_htod"
            return source.run(label, kind, original, (obj, *args), kwargs, plan)

        return to_device

    # -- the runtime's own calls ------------------------------------------------------------

    def _hook_runtime(self) -> None:
        rt = self.cp.cuda.runtime
        source = self
        originals = {name: getattr(rt, name) for name in (
            "memcpy", "memcpyAsync", "memset", "memsetAsync", "eventRecord", "streamWaitEvent",
            "eventSynchronize", "eventQuery", "streamSynchronize", "streamQuery",
            "deviceSynchronize")}

        def memcpy(dst: int, src: int, size: int, kind: int) -> Any:
            source.raw_copy(dst, src, size, kind, LEGACY_STREAM, True, "runtime.memcpy")
            return source.opaque(originals["memcpy"], dst, src, size, kind)

        def memcpy_async(dst: int, src: int, size: int, kind: int, stream: int) -> Any:
            source.raw_copy(dst, src, size, kind, stream, False, "runtime.memcpyAsync")
            return source.opaque(originals["memcpyAsync"], dst, src, size, kind, stream)

        def memset(ptr: int, value: int, size: int) -> Any:
            result = originals["memset"](ptr, value, size)
            source.raw_memset(ptr, size, LEGACY_STREAM, "runtime.memset")
            return result

        def memset_async(ptr: int, value: int, size: int, stream: int) -> Any:
            result = originals["memsetAsync"](ptr, value, size, stream)
            source.raw_memset(ptr, size, stream, "runtime.memsetAsync")
            return result

        def event_record(event: int, stream: int) -> Any:
            source.ordered()
            result = originals["eventRecord"](event, stream)
            source.emit(["record", event, source.sid(stream), program_site()])
            return result

        def stream_wait_event(stream: int, event: int, flags: int = 0) -> Any:
            result = originals["streamWaitEvent"](stream, event, flags)
            source.emit(["wait", event, source.sid(stream), program_site()])
            return result

        def event_synchronize(event: int) -> Any:
            source.on_sync(["sync_event", event, program_site()])
            return originals["eventSynchronize"](event)

        def event_query(event: int) -> Any:
            status = originals["eventQuery"](event)
            source.emit(["query", event, status == 0, program_site()])
            return status

        def stream_synchronize(stream: int) -> Any:
            source.on_sync(["sync_stream", source.sid(stream), program_site()])
            return originals["streamSynchronize"](stream)

        def stream_query(stream: int) -> Any:
            status = originals["streamQuery"](stream)
            if status == 0:  # idle: as a synchronize that returned at once (see Stream.done)
                source.emit(["sync_stream", source.sid(stream), program_site()])
            return status

        def device_synchronize() -> Any:
            source.on_sync(["sync_device", program_site()])
            return originals["deviceSynchronize"]()

        for name, wrapper in (("memcpy", memcpy), ("memcpyAsync", memcpy_async),
                              ("memset", memset), ("memsetAsync", memset_async),
                              ("eventRecord", event_record),
                              ("streamWaitEvent", stream_wait_event),
                              ("eventSynchronize", event_synchronize),
                              ("eventQuery", event_query),
                              ("streamSynchronize", stream_synchronize),
                              ("streamQuery", stream_query),
                              ("deviceSynchronize", device_synchronize)):
            self.patch(rt, name, _named(wrapper, name, originals[name]))

    def space(self, ptr: int, kind: int, host_side: bool) -> str | None:
        """Where one side of a raw memcpy lies: ``d``, ``h`` (pinned), or None (pageable host
        memory: the program's private bytes)."""
        rt = self._rt
        if kind == rt["memcpyHostToHost"] or (host_side and kind in (
                rt["memcpyHostToDevice"], rt["memcpyDeviceToHost"])):
            return HOST if self.is_pinned(ptr) else None
        if kind in (rt["memcpyHostToDevice"], rt["memcpyDeviceToHost"],
                    rt["memcpyDeviceToDevice"]):
            return DEVICE
        try:  # cudaMemcpyDefault: the pointer says
            memory = rt["pointerGetMemoryType"](ptr)
        except Exception:
            return None
        if memory in (rt["memoryTypeDevice"], rt["memoryTypeManaged"]):
            return DEVICE
        return HOST if memory == rt["memoryTypeHost"] else None

    def raw_copy(self, dst: int, src: int, size: int, kind: int, stream: int, waits: bool,
                 label: str) -> None:
        if not self.active or not size:
            return
        try:
            rt = self._rt
            src_space = self.space(src, kind, kind == rt["memcpyHostToDevice"])
            dst_space = self.space(dst, kind, kind == rt["memcpyDeviceToHost"])
            spaces = (src_space or HOST, dst_space or HOST)
            copy_kind = {(HOST, DEVICE): "copy_htod", (DEVICE, HOST): "copy_dtoh",
                         (DEVICE, DEVICE): "copy_dtod"}.get(spaces, "copy_htoh")
            sync = waits or src_space is None or dst_space is None
            self.copy_op(label, copy_kind, self.sid(stream),
                         [] if src_space is None else [[src_space, src, size]],
                         [] if dst_space is None else [[dst_space, dst, size]], sync)
        except Exception as exc:
            self.failed(label, exc)

    def raw_memset(self, ptr: int, size: int, stream: int, label: str) -> None:
        if not self.active or not size:
            return
        try:
            self.ordered()
            self.op(self.sid(stream), "memset", [], [[DEVICE, ptr, size]], program_site(),
                    label)
        except Exception as exc:
            self.failed(label, exc)


class _CallProxy:
    """A watched stand-in for a module function or callable object: calls it as one op, and
    hands every other attribute through."""

    def __init__(self, source: _CupySource, original: Any, label: str, kind: str,
                 out_at: int | None, inplace: bool = False, outs_from: int | None = None,
                 ) -> None:
        self._source, self._original, self._label = source, original, label
        self._kind, self._out_at, self._inplace, self._outs_from = kind, out_at, inplace, outs_from

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        source = self._source

        def plan() -> tuple[list[Access], list[Access], int]:
            rest, outs = list(args), [kwargs.get("out")]
            if self._outs_from is not None:  # a ufunc: every positional past nin is an output
                rest, outs = rest[:self._outs_from], outs + rest[self._outs_from:]
            elif outs[0] is None and self._out_at is not None and len(rest) > self._out_at:
                outs = [rest.pop(self._out_at)]
            writes = [r for out in outs for r in source.ranges(out)]
            if self._inplace and args:
                writes += list(source.ranges(args[0]))
            return source.arg_ranges(rest, kwargs), writes, source.current_sid()

        return source.run(self._label, self._kind, self._original, args, kwargs, plan)

    def __getattr__(self, name: str) -> Any:
        original = self.__dict__.get("_original")  # absent while copy or pickle build one
        if original is None:
            raise AttributeError(name)
        return getattr(original, name)

    def __repr__(self) -> str:
        return repr(self._original)


class _UfuncProxy(_CallProxy):
    """A watched CuPy ufunc: ``cupy.add(a, b, out=c)`` and its ``reduce``, ``accumulate``,
    ``reduceat``, ``outer`` and ``at`` (which writes its first argument)."""

    _METHODS = ("reduce", "accumulate", "reduceat", "outer", "at")

    def __init__(self, source: _CupySource, ufunc: Any, label: str) -> None:
        name = kernel_identifier(str(ufunc.name).removeprefix("cupy_"))
        super().__init__(source, ufunc, label, "kernel:" + name, None, outs_from=ufunc.nin)
        self.__name__ = ufunc.__name__
        self.__doc__ = ufunc.__doc__
        self._methods: dict[str, _CallProxy] = {}

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # isinstance(cupy.add, cupy.ufunc) stays true (cupyx.jit and fusion ask); Cython's
        # own type tests look at the real type and refuse the proxy instead.
        return type(self._original)

    def __getattr__(self, name: str) -> Any:
        methods = self.__dict__.get("_methods")
        if methods is None or name not in _UfuncProxy._METHODS:
            return super().__getattr__(name)
        method = methods.get(name)
        if method is None:
            method = methods[name] = _CallProxy(
                self._source, getattr(self._original, name), f"{self._label}.{name}",
                self._kind, None, inplace=name == "at")
        return method


_HOST_SOURCE: _CupySource | None = None
"""The installed source that :class:`PinnedArray` reports to."""
_PINNED_CLASS: type | None = None
_NUMPY_WRITES_FIRST = frozenset({"copyto", "put", "place", "putmask", "fill_diagonal",
                                 "put_along_axis"})
"""NumPy functions that write their first argument (any ``out=`` is written too)."""


def _pinned_array_class() -> type:
    """:class:`PinnedArray`, made once NumPy is imported (this module imports no NumPy)."""
    global _PINNED_CLASS, PinnedArray
    if _PINNED_CLASS is None:
        _PINNED_CLASS = PinnedArray = _make_pinned_array_class()
    return _PINNED_CLASS


def _host(kind: str, arrays: Iterable[Any]) -> None:
    source = _HOST_SOURCE
    if source is not None:
        source.host_access(kind, arrays)


def _make_pinned_array_class() -> type:
    import numpy

    plain = numpy.ndarray

    def pinned_in(values: Iterable[Any]) -> list[Any]:
        found = []
        for v in values:
            if isinstance(v, PinnedArray):
                found.append(v)
            elif isinstance(v, (list, tuple)):
                found += [x for x in v if isinstance(x, PinnedArray)]
        return found

    def unwrap(v: Any) -> Any:
        if isinstance(v, PinnedArray):
            return v.view(plain)
        if isinstance(v, tuple):
            return tuple(unwrap(x) for x in v)
        return v

    class PinnedArray(plain):
        """A NumPy array over pinned host memory (what ``cupyx.empty_pinned`` returns while
        the CuPy source is installed): the host's reads and writes of it are ops, since a
        stream's copy reads or writes the same bytes behind the host's back. Views stay
        PinnedArrays; results computed from it are plain NumPy arrays."""

        def __setitem__(self, key: Any, value: Any) -> None:
            target = plain.__getitem__(self, key) if is_basic_index(key) else self
            _host("host_write", [target] if isinstance(target, plain) else [self])
            _host("host_read", pinned_in([value]))
            _call_host(plain.__setitem__, self, key, value)  # NumPy indexes self inside

        def __getitem__(self, key: Any) -> Any:
            result = plain.__getitem__(self, key)
            if not (isinstance(result, plain) and _same_bytes(result, self)):
                _host("host_read", [self])  # an element or a copy: the bytes were read
            return result

        def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
            outs = kwargs.get("out") or ()
            written = pinned_in(outs) + (pinned_in(inputs[:1]) if method == "at" else [])
            _host("host_read", pinned_in(inputs))
            _host("host_write", written)
            if outs:
                kwargs["out"] = unwrap(tuple(outs))
            result = _call_host(getattr(ufunc, method), *unwrap(inputs), **kwargs)
            if outs:  # the caller's own arrays, as NumPy returns them
                return outs[0] if len(outs) == 1 else tuple(outs)
            return result

        def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
            first = func.__name__ in _NUMPY_WRITES_FIRST
            written = pinned_in([kwargs.get("out")]) + (pinned_in(args[:1]) if first else [])
            _host("host_read", pinned_in(args[1:] if first else args)
                  + pinned_in([v for k, v in kwargs.items() if k != "out"]))
            _host("host_write", written)
            return _call_host(plain.__array_function__, self, func, types, args, kwargs)

        def fill(self, value: Any) -> None:
            _host("host_write", [self])
            plain.fill(self, value)

        def sort(self, *args: Any, **kwargs: Any) -> None:
            _host("host_write", [self])
            _call_host(plain.sort, self, *args, **kwargs)

        def copy(self, *args: Any, **kwargs: Any) -> Any:
            _host("host_read", [self])
            return plain.copy(self.view(plain), *args, **kwargs)

        def tolist(self) -> Any:
            _host("host_read", [self])
            return plain.tolist(self)

        def tobytes(self, *args: Any, **kwargs: Any) -> bytes:
            _host("host_read", [self])
            return plain.tobytes(self, *args, **kwargs)

        def item(self, *args: Any) -> Any:
            _host("host_read", [self])
            return plain.item(self, *args)

        def __reduce__(self) -> Any:  # pickled as the plain array it is
            _host("host_read", [self])
            return plain.__reduce__(self.view(plain))

    PinnedArray.__module__ = __name__
    return PinnedArray


def _same_bytes(a: Any, b: Any) -> bool:
    """Whether two NumPy arrays' extents overlap (``numpy.may_share_memory`` would come back
    to the pinned array's own ``__array_function__``)."""
    spans = []
    for x in (a, b):
        span = extent(x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize)
        if span is None:
            return False
        spans.append(span)
    return spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]


def _call_host(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    source = _HOST_SOURCE
    if source is None:
        return call(*args, **kwargs)
    return source.host_call(call, *args, **kwargs)


PinnedArray: type | None = None
"""The pinned array class, once :func:`install` made it."""


def _kernel_params(in_params: Any, out_params: Any) -> tuple[ElementwiseParam, ...] | None:
    """An ElementwiseKernel's parameters, or None where the text is not ours to read (CuPy has
    accepted it already; its arguments are then counted as written)."""
    try:
        return elementwise_params(in_params, False) + elementwise_params(out_params, True)
    except (AttributeError, ValueError):
        return None


def _is_zero(value: Any) -> bool:
    try:
        return not hasattr(value, "__cuda_array_interface__") and bool(value == 0)
    except Exception:  # an array-like with no single truth value
        return False


def _named(function: Callable[..., Any], name: str, original: Any) -> Callable[..., Any]:
    """``function`` under the hooked attribute's name, with its doc."""
    function.__name__ = function.__qualname__ = name
    function.__doc__ = getattr(original, "__doc__", None)
    return function


def _out_position(function: Callable[..., Any]) -> int | None:
    """Where a function's positional ``out`` parameter is (``cupy.dot(a, b, out)``)."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    for i, p in enumerate(params):
        if p.name == "out" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return i
    return None


def _wraps(original: Callable[..., Any], proxy: _CallProxy) -> Callable[..., Any]:
    """A plain function around a proxy, with the original's name, doc and signature (a
    function, unlike an object, keeps working where CuPy or the program inspects it)."""
    @functools.wraps(original)
    def watched(*args: Any, **kwargs: Any) -> Any:
        return proxy(*args, **kwargs)

    return watched


def available() -> str | None:
    """CuPy's version if ``import cupy`` works here, else None (never raises): what ``hello``
    lists as this source's version, and whether ``gpurace watch`` can switch it on."""
    try:
        import cupy
    except Exception:
        return None
    return str(getattr(cupy, "__version__", "unknown"))


_SPIN_CODE = r'''
extern "C" __global__ void gpurace_delay(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
'''
"""The delay: one thread spinning on the global timer (nanoseconds, whatever the clock)."""


def install(sink: Sink, amplifier: Amplifier | None = None) -> Callable[[], None]:
    """Start reporting the CuPy work of this process to ``sink`` (one ``note`` per thing this
    source cannot see comes first), queueing the delays ``amplifier`` asks for; the function
    that stops it."""
    import cupy

    source = _CupySource(sink, cupy)
    source.amplifier = amplifier
    source.install()
    return source.uninstall
