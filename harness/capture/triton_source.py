"""The Triton source: each launch of a Triton kernel of the program's own (``@triton.jit``,
launched as ``kernel[grid](...)``) is an op on the stream it was launched on, reading and
writing the tensors it was given as its TTIR says (:mod:`harness.capture.triton_ir`).

It wraps ``JITFunction.run``, the one call every such launch goes through (autotuned and
heuristic kernels included): after the original has launched, the compiled kernel's TTIR
(``CompiledKernel.asm["ttir"]``, read once per compiled kernel) names which pointer
parameters it reads and writes, and the bound arguments of those names are the tensors. A
kernel whose TTIR cannot be followed reads and writes every tensor it is given, and the notes
say so once. Only CUDA tensors are memory here; a warm-up (``warmup=True``) launches nothing.

Not seen yet, and said in a note: kernels launched without ``JITFunction.run`` (torch.compile's
generated kernels, which Inductor launches through the compiled kernel's own launcher).
``--amplify`` queues no delay before a Triton kernel.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from harness.capture import events as E
from harness.capture.amplify import Amplifier
from harness.capture.sites import program_frame, site_of
from harness.capture.source import Failures, Installed
from harness.capture.torch_ops import byte_spans
from harness.capture.triton_ir import KernelAccess, UnreadableIR, kernel_access


class TritonSource:
    name = "triton"
    module = "triton"
    title = "Triton"

    def available(self) -> str | None:
        try:
            import torch  # noqa: F401 - the tensors and streams a launch is given
            import triton
        except Exception:  # a broken install is not importable either
            return None
        return str(triton.__version__)

    def install(self, sink: E.Sink, amplifier: Amplifier | None = None) -> Installed:
        return install(sink)


SOURCE = TritonSource()


class _Launches:
    """The source's state: what each compiled kernel accesses, and what it cost."""

    def __init__(self, sink: E.Sink, failures: Failures) -> None:
        import torch
        self.torch = torch
        self.sink = sink
        self.failures = failures
        self.on = True
        self.access: dict[Any, KernelAccess | None] = {}  # compiled kernel -> its access
        self.ops = 0
        self.own_ns = 0

    def launched(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 kernel: Any, t0: int) -> None:
        """Say the launch of ``fn`` (compiled as ``kernel``) with these arguments."""
        start = perf_counter_ns()
        access = self._access_of(fn, kernel)
        names = list(fn.arg_names)
        bound = dict(zip(names, args))
        bound.update((k, v) for k, v in kwargs.items() if k in names)
        reads: list[list[Any]] = []
        writes: list[list[Any]] = []
        device = None
        Tensor = self.torch.Tensor
        for name, value in bound.items():
            if not isinstance(value, Tensor) or not value.is_cuda or value.data_ptr() == 0:
                continue
            read = access is None or name in access.read
            written = access is None or name in access.written
            if not (read or written):
                continue
            if device is None:
                device = value.get_device()
            spans = byte_spans(E.DEVICE, value, value.data_ptr())
            if read:
                reads.extend(spans)
            if written:
                writes.extend(spans)
        if device is None:
            return  # no CUDA tensor among what it touches
        sid = self.torch._C._cuda_getCurrentRawStream(device)  # where Triton launched it
        site = site_of(program_frame(1))
        name = getattr(fn, "__name__", None) or "triton_kernel"
        self.sink.emit(["op", sid, f"kernel:{name}", reads, writes,
                        {"site": site, "op": name, "source": "triton", "t": t0}])
        self.ops += 1
        self.own_ns += perf_counter_ns() - start

    def _access_of(self, fn: Any, kernel: Any) -> KernelAccess | None:
        """What the compiled kernel reads and writes (None: every tensor, both)."""
        if kernel in self.access:
            return self.access[kernel]
        try:
            found: KernelAccess | None = kernel_access(str(kernel.asm["ttir"]))
            if found is not None and not set(found.pointers) <= set(fn.arg_names):
                raise UnreadableIR("its TTIR names parameters the kernel does not have: "
                                   + ", ".join(sorted(set(found.pointers)
                                                      - set(fn.arg_names))))
        except (UnreadableIR, KeyError, AttributeError) as exc:
            name = getattr(fn, "__name__", "a kernel")
            self.failures.failed(f"the TTIR of {name} (every tensor it is given taken as "
                                 "read and written)", exc)
            found = None
        self.access[kernel] = found
        return found

    def stats(self) -> list[Any]:
        return ["stats", {"source": "triton", "ops": self.ops, "own_ns": self.own_ns,
                          "max_own_ns": 0, "max_site": None, "slow": [],
                          "failures": dict(self.failures.counts)}]


def install(sink: E.Sink) -> Installed:
    """Capture the program's Triton launches into ``sink`` from now on."""
    from triton.runtime.jit import JITFunction

    failures = Failures(sink.emit, "the Triton source")
    state = _Launches(sink, failures)
    original = JITFunction.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The call passes through as it came: Triton's own signature (grid=, warmup=, launch
        # options) is Triton's to check, whichever version it is.
        t0 = perf_counter_ns()
        kernel = original(self, *args, **kwargs)
        if state.on and not kwargs.get("warmup") and kernel is not None:
            try:
                state.launched(self, args, kwargs, kernel, t0)
            except Exception as exc:  # never the program's failure: its kernel has run
                failures.failed(f"the launch of {getattr(self, '__name__', 'a kernel')}", exc)
        return kernel

    JITFunction.run = run  # type: ignore[method-assign]
    sink.emit(["note", "Triton: kernels launched through @triton.jit are seen; kernels "
                       "launched otherwise (torch.compile's generated kernels) are not, and "
                       "--amplify queues no delay before a Triton kernel"])

    def stop() -> None:
        state.on = False
        JITFunction.run = original  # type: ignore[method-assign]
        failures.say_summary()
        sink.emit(state.stats())

    return Installed(stop, failures, state)
