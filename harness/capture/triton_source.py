"""The Triton source: each launch of a Triton kernel is an op on the stream it was launched on,
reading and writing the tensors it was given: the program's own ``@triton.jit`` kernels, and
the kernels torch.compile generates (Inductor's).

A kernel of the program's own is launched as ``kernel[grid](...)``, through ``JITFunction.run``
(autotuned and heuristic kernels included), which the source wraps: after the original has
launched, the compiled kernel's TTIR (``CompiledKernel.asm["ttir"]``, read once per compiled
kernel, :mod:`harness.capture.triton_ir`) names which pointer parameters it reads and writes,
and the bound arguments of those names are the tensors. A warm-up (``warmup=True``) launches
nothing.

Inductor launches its kernels through ``CachingAutotuner.run(*args, stream=...)``, which the
source wraps once torch.compile's runtime is imported: the op is on the stream Inductor names,
and what it reads and writes comes from the TTIR of its launcher where Inductor kept it, else
from Inductor's own names (``in_ptr`` read, ``out_ptr`` written, ``in_out_ptr`` and the
arguments it lists as mutated both). Such a kernel's site is the program's line that called the
compiled code (the generated wrapper's lines are torch.compile's).

A kernel whose accesses cannot be followed reads and writes every tensor it is given, and the
notes say so once. Only CUDA tensors are memory here. A delay ``--amplify`` asks for before a
kernel is queued on the current stream before its launch (:mod:`harness.capture.spin`), never
while a CUDA graph is captured.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from harness.capture import events as E
from harness.capture import spin
from harness.capture.amplify import Amplifier
from harness.capture.imports import after_import
from harness.capture.sites import program_frame, site_of
from harness.capture.source import Failures, Installed
from harness.capture.torch_graphs import captured_elsewhere
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
        return install(sink, amplifier)


SOURCE = TritonSource()


class _Launches:
    """The source's state: what each compiled kernel accesses, and what it cost."""

    def __init__(self, sink: E.Sink, failures: Failures,
                 amplifier: Amplifier | None = None) -> None:
        import torch
        self.torch = torch
        self.sink = sink
        self.failures = failures
        self.amplifier = amplifier
        self.on = True
        self.access: dict[Any, KernelAccess | None] = {}  # compiled kernel -> its access
        self.ops = 0
        self.own_ns = 0

    def delay_before(self, kernel: str, stream: Any = None) -> None:
        """Queue on the current stream the delay asked for before ``kernel`` at the program's
        line, where one is. Inside a CUDA graph's capture the kernel is the graph's: only a
        delay for a race inside the graph is captured there; the others are queued before
        the graph's replays."""
        assert self.amplifier is not None
        torch = self.torch
        site, kind = site_of(program_frame(1)), f"kernel:{kernel}"
        capturing = torch.cuda.is_current_stream_capturing()
        if capturing:  # the graph's: delayed before its replays, or inside it
            captured_elsewhere(site, kind)
        delay = self.amplifier.wants(site, kind, in_graph=capturing)
        if delay is None:
            return
        index = torch.cuda.current_device()
        sid = torch._C._cuda_getCurrentRawStream(index)
        if isinstance(stream, int) and stream != sid:
            self.amplifier.failed(delay, "the kernel was launched on a stream other than the "
                                         "current one")
            return
        spin.queue(torch, self.amplifier, self.sink.emit, delay, index, sid)

    def launched(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 kernel: Any, t0: int) -> None:
        """Say the launch of ``fn`` (compiled as ``kernel``) with these arguments."""
        start = perf_counter_ns()
        access = self._access_of(fn, kernel)
        names = list(fn.arg_names)
        bound = dict(zip(names, args))
        bound.update((k, v) for k, v in kwargs.items() if k in names)
        self._say(getattr(fn, "__name__", None) or "triton_kernel", bound, access, None, t0,
                  start)

    def inductor_launched(self, autotuner: Any, args: tuple[Any, ...], stream: Any,
                          t0: int) -> None:
        """Say the launch of one of torch.compile's kernels on ``stream``."""
        start = perf_counter_ns()
        fn = autotuner.fn
        access = self._inductor_access(autotuner)
        bound = dict(zip(fn.arg_names, args))
        sid = stream if isinstance(stream, int) else None
        self._say(getattr(fn, "__name__", None) or "inductor_kernel", bound, access, sid, t0,
                  start)

    def _say(self, kernel: str, bound: dict[str, Any], access: KernelAccess | None,
             sid: int | None, t0: int, start: int) -> None:
        """The op of a launch: the CUDA tensors bound to the parameters it reads and writes,
        on ``sid`` (None: the current stream, where Triton launched it)."""
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
        if sid is None:
            sid = self.torch._C._cuda_getCurrentRawStream(device)
        site = site_of(program_frame(1))
        self.sink.emit(["op", sid, f"kernel:{kernel}", reads, writes,
                        {"site": site, "op": kernel, "source": "triton", "t": t0}])
        self.ops += 1
        self.own_ns += perf_counter_ns() - start

    def _access_of(self, fn: Any, kernel: Any) -> KernelAccess | None:
        """What the compiled kernel reads and writes (None: every tensor, both)."""
        if kernel in self.access:
            return self.access[kernel]
        try:
            found: KernelAccess | None = _ttir_access(fn, kernel)
        except (UnreadableIR, KeyError, AttributeError) as exc:
            name = getattr(fn, "__name__", "a kernel")
            self.failures.failed(f"the TTIR of {name} (every tensor it is given taken as "
                                 "read and written)", exc)
            found = None
        self.access[kernel] = found
        return found

    def _inductor_access(self, autotuner: Any) -> KernelAccess | None:
        """What one of torch.compile's kernels reads and writes: its launcher's TTIR where
        Inductor kept it, else Inductor's names for its parameters."""
        if autotuner in self.access:
            return self.access[autotuner]
        fn = autotuner.fn
        try:
            found = _ttir_access(fn, autotuner.launchers[0].bin)
        except (UnreadableIR, KeyError, AttributeError, IndexError, TypeError):
            # No TTIR kept (a launcher without it, none compiled yet), or not this kernel's:
            # Inductor's names instead.
            found = inductor_names(tuple(fn.arg_names),
                                   frozenset(getattr(autotuner, "mutated_arg_names", ())))
        self.access[autotuner] = found
        return found

    def stats(self) -> list[Any]:
        return ["stats", {"source": "triton", "ops": self.ops, "own_ns": self.own_ns,
                          "max_own_ns": 0, "max_site": None, "slow": [],
                          "failures": dict(self.failures.counts)}]


def _ttir_access(fn: Any, kernel: Any) -> KernelAccess:
    """What compiled ``kernel`` of ``fn`` reads and writes, from its TTIR; raises
    :class:`UnreadableIR` where the TTIR names parameters ``fn`` does not have (and KeyError
    or AttributeError where the kernel kept no TTIR)."""
    found = kernel_access(str(kernel.asm["ttir"]))
    strange = set(found.pointers) - set(fn.arg_names)
    if strange:
        raise UnreadableIR("its TTIR names parameters the kernel does not have: "
                           + ", ".join(sorted(strange)))
    return found


INDUCTOR = "torch._inductor.runtime.triton_heuristics"
"""torch.compile's kernel launcher, imported at the program's first compiled call."""


def inductor_names(params: tuple[str, ...], mutated: frozenset[str]) -> KernelAccess:
    """What an Inductor kernel reads and writes, by the names Inductor gives its parameters:
    ``in_ptrN`` read, ``out_ptrN`` written, ``in_out_ptrN`` and those it lists as mutated both;
    any other parameter (a kernel of the program's own inside compiled code) both, unless
    Inductor's analysis of it says it is only read."""
    read, written = set(), set()
    for name in params:
        if name.startswith("out_ptr"):
            written.add(name)
            continue
        read.add(name)
        if name.startswith("in_out_ptr") or name in mutated or not name.startswith("in_ptr"):
            written.add(name)
    pointers = tuple(params)
    return KernelAccess("inductor", pointers, pointers, frozenset(read), frozenset(written))


def _wrap_inductor(state: _Launches, failures: Failures) -> Callable[[], None]:
    """Wrap ``CachingAutotuner.run``; returns what puts it back."""
    import importlib
    autotuner = getattr(importlib.import_module(INDUCTOR), "CachingAutotuner", None)
    original = getattr(autotuner, "run", None)
    if original is None:
        state.sink.emit(["note", "Triton: this PyTorch's torch.compile launches its kernels "
                                 "without CachingAutotuner.run: its generated kernels are "
                                 "not seen"])
        return lambda: None

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = perf_counter_ns()
        if state.amplifier is not None and state.on and not kwargs.get("benchmark_run"):
            try:
                state.delay_before(getattr(self.fn, "__name__", None) or "inductor_kernel",
                                   kwargs.get("stream"))
            except Exception as exc:
                failures.failed("a delay before a torch.compile kernel", exc)
        out = original(self, *args, **kwargs)
        if state.on and not kwargs.get("benchmark_run"):
            try:
                state.inductor_launched(self, args, kwargs.get("stream"), t0)
            except Exception as exc:  # never the program's failure: its kernel has run
                failures.failed("a torch.compile kernel's launch", exc)
        return out

    autotuner.run = run
    return lambda: setattr(autotuner, "run", original)


def install(sink: E.Sink, amplifier: Amplifier | None = None) -> Installed:
    """Capture the program's Triton launches into ``sink`` from now on, queueing the delays
    ``amplifier`` asks for before them."""
    from triton.runtime.jit import JITFunction

    failures = Failures(sink.emit, "the Triton source")
    state = _Launches(sink, failures, amplifier)
    original = JITFunction.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The call passes through as it came: Triton's own signature (grid=, warmup=, launch
        # options) is Triton's to check, whichever version it is.
        t0 = perf_counter_ns()
        if state.amplifier is not None and state.on and not kwargs.get("warmup"):
            try:
                state.delay_before(getattr(self, "__name__", None) or "triton_kernel")
            except Exception as exc:
                failures.failed("a delay before a Triton kernel", exc)
        kernel = original(self, *args, **kwargs)
        if state.on and not kwargs.get("warmup") and kernel is not None:
            try:
                state.launched(self, args, kwargs, kernel, t0)
            except Exception as exc:  # never the program's failure: its kernel has run
                failures.failed(f"the launch of {getattr(self, '__name__', 'a kernel')}", exc)
        return kernel

    JITFunction.run = run  # type: ignore[method-assign]
    unwrap: list[Callable[[], None]] = []

    def wrap_inductor() -> None:
        try:
            unwrap.append(_wrap_inductor(state, failures))
        except Exception as exc:  # a torch.compile runtime of another shape
            failures.failed("torch.compile's kernel launcher", exc)

    cancel = after_import(INDUCTOR, wrap_inductor)
    sink.emit(["note", "Triton: kernels launched other than through @triton.jit or "
                       "torch.compile's launcher are not seen"])

    def stop() -> None:
        state.on = False
        cancel()
        for undo in unwrap:
            undo()
        JITFunction.run = original  # type: ignore[method-assign]
        failures.say_summary()
        sink.emit(state.stats())

    return Installed(stop, failures, state)
