"""The CuPy source: a CuPy program's stream work, said in the capture vocabulary.

CuPy's hot paths are Cython (``cdef`` classes, ``cpdef`` methods, C-level calls into the CUDA
runtime), so nothing below CuPy's Python surface can be patched from Python. This source hooks
what CuPy itself lets Python replace, and reports each call there as one op; each kind of hook
lives in a module of its own:

* :mod:`~harness.capture.cupy_memory`: the device pool's memory hook (in every thread) and the
  pinned pool's blocks;
* :mod:`~harness.capture.cupy_streams`: ``cupy.cuda.Stream``, ``Event`` and ``Device``, and the
  runtime's event, wait and synchronize calls;
* :mod:`~harness.capture.cupy_ndarray`: ``cupy.ndarray``'s methods and operators, through
  :mod:`~harness.capture.cupy_copies` for ``get``/``set`` (and the runtime's memcpy and memset);
* :mod:`~harness.capture.cupy_kernels`: ``RawKernel``, ``RawModule``, ``ElementwiseKernel``,
  ``ReductionKernel``;
* :mod:`~harness.capture.cupy_functions`: the ufuncs and functions of ``cupy``,
  ``cupy.linalg``, ``cupy.fft``, ``cupy.random``;
* :mod:`~harness.capture.cupy_pinned`: the NumPy arrays ``cupyx.empty_pinned`` and its kin
  return, whose host reads and writes are host ops;
* :mod:`~harness.capture.cupy_pointers`: ``MemoryPointer``'s copies and fills, on the pointers
  ``ndarray.data`` and ``cupy.cuda.alloc`` hand out.

They report through one :class:`~harness.capture.cupy_capture.CupyCapture`: one watched call is
one op on the stream it was issued on; the arrays it was given are read, its ``out=`` and
in-place targets and the fresh arrays it returns are written. A CUPTI layer, which would see
kernels CuPy launches from C, is not part of this source: :data:`BLIND_SPOTS` says, at install,
what the program may do that is not seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.capture.amplify import Amplifier
from harness.capture.cupy_capture import CupyCapture
from harness.capture.cupy_copies import CopyHooks
from harness.capture.cupy_functions import FunctionHooks
from harness.capture.cupy_kernels import KernelHooks
from harness.capture.cupy_memory import MemoryHooks
from harness.capture.cupy_ndarray import NdarrayHooks
from harness.capture.cupy_pinned import PinnedHost
from harness.capture.cupy_pointers import PointerHooks
from harness.capture.cupy_streams import StreamHooks
from harness.capture.events import Sink
from harness.capture.source import Installed

BLIND_SPOTS = (
    "host reads and writes of pinned memory are seen on the NumPy arrays cupyx.empty_pinned, "
    "zeros_pinned and their _like kin return (and on CuPy's own staging buffers), not on other "
    "pinned memory nor through numpy.asarray(a), a.view(numpy.ndarray), ctypes or the buffer "
    "protocol",
    "cupy.cuda.Function launches (RawKernel.kernel(...)) are not seen",
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


@dataclass(frozen=True, slots=True)
class CupyHooks:
    """Every hook of one install, over the capture they report through."""

    capture: CupyCapture
    memory: MemoryHooks
    streams: StreamHooks
    copies: CopyHooks
    ndarray: NdarrayHooks
    kernels: KernelHooks
    functions: FunctionHooks
    pinned: PinnedHost
    pointers: PointerHooks

    @classmethod
    def over(cls, capture: CupyCapture) -> CupyHooks:
        copies = CopyHooks(capture)
        return cls(capture, MemoryHooks(capture), StreamHooks(capture), copies,
                   NdarrayHooks(capture, copies), KernelHooks(capture), FunctionHooks(capture),
                   PinnedHost(capture), PointerHooks(capture, copies))

    def steps(self) -> tuple[tuple[str, Callable[[], None]], ...]:
        """Each step of the install, by the name its failure is noted under, in order."""
        def runtime() -> None:
            self.copies.install_runtime()
            self.streams.install_runtime()

        return (("memory", self.memory.install), ("pinned", self.memory.install_pinned),
                ("streams", self.streams.install_streams),
                ("events", self.streams.install_events), ("ndarray", self.ndarray.install),
                ("kernels", self.kernels.install), ("device", self.streams.install_device),
                ("runtime", runtime), ("functions", self.functions.install),
                ("pinned_arrays", self.pinned.install), ("pointers", self.pointers.install))

    def install(self) -> None:
        """Put every hook in, note what none can see, and start reporting."""
        capture = self.capture
        capture.active = True
        for text in BLIND_SPOTS:
            capture.note(text)
        for name, step in self.steps():
            try:
                step()
            except Exception as exc:  # a CuPy that moved: watch the rest, say what is missing
                capture.note(f"cupy source: hook_{name} not installed ({exc!r})")


class CupySource:
    """The CuPy source, as every source is (:class:`harness.capture.source.Source`)."""

    name = "cupy"
    module = "cupy"
    title = "CuPy"

    def available(self) -> str | None:
        """CuPy's version if ``import cupy`` works here, else None (never raises): what
        ``hello`` lists as this source's version, and whether ``gpurace watch`` can switch it
        on."""
        try:
            import cupy
        except Exception:
            return None
        return str(getattr(cupy, "__version__", "unknown"))

    def install(self, sink: Sink, amplifier: Amplifier | None = None) -> Installed:
        """Start reporting the CuPy work of this process to ``sink`` (one ``note`` per thing
        this source cannot see comes first), queueing the delays ``amplifier`` asks for; what
        stops it."""
        import cupy

        hooks = CupyHooks.over(CupyCapture(sink, cupy, amplifier))
        hooks.install()
        return Installed(hooks.capture.uninstall, hooks.capture.failures, hooks)


SOURCE = CupySource()
"""This module's source, as :func:`harness.capture.source.load` finds it."""
available = SOURCE.available
install = SOURCE.install
