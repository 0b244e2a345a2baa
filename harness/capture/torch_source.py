"""The PyTorch source: a dispatch mode for what ops touch, PyTorch's GPU trace for the rest.

Every ATen op the program runs passes through :class:`_Mode`, a ``TorchDispatchMode``. Its
schema says what the op does to each tensor: an argument annotated ``Tensor(a!)`` is written, any
other tensor argument read, and a return that aliases nothing is new memory the op writes. (A
return that shares an input's storage without saying so, as ``_unsafe_view``'s does, writes
nothing: memory is written only where an argument says so or where it is new.) Tensors are byte
ranges of their storage: a view at an offset is its own bytes, and a strided view is its runs of
contiguous bytes (or their hull, past :data:`RUNS_MAX`). A CUDA tensor is device memory; a CPU
tensor is memory only when it is pinned, since a stream's copy reads or writes it behind the
host's back; a pageable one is the host's private copy. An op with a CUDA tensor runs on the
current stream of that tensor's device; one with only CPU tensors is the host's own access.

PyTorch's GPU trace callbacks (``torch.cuda._gpu_trace``) give what the dispatcher does not:
event record and wait, stream, event and device synchronize, stream and event creation, and the
caching allocator's frees. ``record_stream`` is an op: the streams it names go with the block's
free, where the allocator defers reuse. Event and stream queries are read through their Python
methods; ``Tensor.tolist`` and ``Tensor.numpy`` of a pinned tensor are host reads.

Ops issued in threads the program starts are seen too (each thread enters the mode as it
starts); ops of processes it starts are not.
"""

from __future__ import annotations

import itertools
import threading
from time import perf_counter_ns
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from harness.capture import events as E
from harness.capture.amplify import Amplifier, Delay
from harness.capture.sites import program_frame, site_of, thread_name, variable_for

RUNS_MAX = 64
"""Contiguous runs of a strided view listed one by one; a view with more is its hull (one range
from its first byte to its last), which may take bytes between its rows for its own."""

_NO_WORK = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "is_pinned",
    "size", "stride", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "set_",
    "resize_", "_has_compatible_shallow_copy_type", "lift_fresh", "detach", "alias",
    "_unsafe_view", "record_stream", "is_same_size", "_local_scalar_dense_placeholder",
})
"""Ops that touch no tensor's bytes (allocate, look at metadata, or view): their new tensors
are still allocations."""

_COPIES = frozenset({"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "copy"})


def available() -> str | None:
    """PyTorch's version when it imports here, else None."""
    try:
        import torch
    except Exception:  # any failure to import is "not here"
        return None
    return str(torch.__version__)


class _Plan:
    """What an op's schema says, worked out once per op overload."""

    __slots__ = ("name", "kind", "args", "written", "fresh_returns", "no_work")

    def __init__(self, func: Any) -> None:
        schema = func._schema
        self.name = schema.name.split("::")[-1]
        self.no_work = self.name in _NO_WORK
        self.kind = "copy" if self.name in _COPIES else (
            "scalar" if self.name == "_local_scalar_dense" else "kernel")
        # (position, keyword, written) of each argument that may hold tensors.
        self.args = []
        for i, arg in enumerate(schema.arguments):
            if "Tensor" in str(arg.type):
                alias = arg.alias_info
                self.args.append((i, arg.name, bool(alias is not None and alias.is_write)))
        self.written = any(w for _, _, w in self.args)
        self.fresh_returns = any(r.alias_info is None and "Tensor" in str(r.type)
                                 for r in schema.returns)
        if schema.returns and not self.written and all(
                r.alias_info is not None for r in schema.returns):
            self.no_work = True  # a view: every return is an input's bytes, nothing written


def _tensors(value: Any) -> Iterable[Any]:
    import torch
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v


def _spans(space: str, t: Any) -> list[list[Any]]:
    """The byte ranges of tensor ``t`` as capture spans: one for a contiguous tensor, one per
    run of contiguous bytes for a strided view (up to :data:`RUNS_MAX`), else the hull."""
    n = t.numel()
    if n == 0:
        return []
    item = t.element_size()
    start = t.data_ptr()
    if t.is_contiguous():
        return [[space, start, n * item]]
    sizes, strides = list(t.shape), list(t.stride())
    if min(strides) >= 0 and 0 not in strides:
        # The trailing dims that lie end to end make one run; the dims before it repeat it.
        k, block = len(sizes), 1
        while k > 0 and strides[k - 1] == block:
            k -= 1
            block *= sizes[k]
        if n // block <= RUNS_MAX:
            return [[space, start + sum(i * st for i, st in zip(index, strides)) * item,
                     block * item] for index in itertools.product(*map(range, sizes[:k]))]
    hi = sum((s - 1) * st for s, st in zip(sizes, strides) if st > 0)
    lo = sum((s - 1) * st for s, st in zip(sizes, strides) if st < 0)
    return [[space, start + lo * item, (hi - lo + 1) * item]]


def _what(t: Any) -> str:
    dtype = str(t.dtype).replace("torch.", "")
    return f"tensor {dtype}[{', '.join(str(s) for s in t.shape)}]"


class _Capture:
    """The source's state, shared by every thread's mode and by the trace callbacks."""

    def __init__(self, sink: E.Sink) -> None:
        import torch
        self.torch = torch
        self.sink = sink
        self.emit = sink.emit
        self.on = True
        self.plans: dict[Any, _Plan] = {}
        self.streams: set[int] = set()
        self.stream_sites: dict[int, str | None] = {}
        self.live: dict[int, dict[str, Any]] = {}  # device storage base -> its alloc's meta
        self.pinned: dict[int, dict[str, Any]] = {}  # pinned storage base -> its alloc's meta
        self.recorded: dict[int, set[int]] = {}  # device storage base -> record_stream sids
        self.to_name: list[tuple[dict[str, Any], FrameType, int]] = []
        self.local = threading.local()  # .inflight: the op being run, not yet emitted
        self.raw_stream = torch._C._cuda_getCurrentRawStream
        self.main_thread = threading.main_thread()
        self.amplifier: Amplifier | None = None
        self.cycles_per_us: dict[int, float] = {}  # device index -> the spin kernel's rate

    # ---- names -------------------------------------------------------------------------------
    def name_pending(self) -> None:
        """Give the tensors made since the last call the program's names for them, from the
        frames that made them (by now the assignment has run), while their allocation events
        are still held by the sink."""
        pending, self.to_name = self.to_name, []
        Tensor = self.torch.Tensor
        for meta, frame, base in pending:
            meta["name"] = variable_for(frame, lambda v, base=base: isinstance(v, Tensor)
                                        and v.untyped_storage().data_ptr() == base)

    def stream(self, sid: int, frame: FrameType | None) -> None:
        """Announce stream ``sid`` the first time the program uses it, by its variable's name
        where the frame has one."""
        self.streams.add(sid)
        legacy = sid == E.LEGACY_STREAM
        Stream = self.torch.cuda.Stream
        name = None if legacy else variable_for(
            frame, lambda v: isinstance(v, Stream) and v.cuda_stream == sid)
        self.emit(["stream", sid, {"blocking": sid == E.PER_THREAD_STREAM, "legacy": legacy,
                                   "name": name, "site": self.stream_sites.get(sid),
                                   "source": "torch"}])

    # ---- ops ---------------------------------------------------------------------------------
    def flush_inflight(self) -> None:
        """A callback fired inside an op (a synchronize in ``.item()``): the op comes first."""
        inflight = getattr(self.local, "inflight", None)
        if inflight is not None:
            self.local.inflight = None
            self.emit(inflight)

    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        plan = self.plans.get(func)
        if plan is None:
            plan = self.plans[func] = _Plan(func)
        if plan.no_work and not plan.fresh_returns:
            if plan.name == "record_stream":
                self.record_stream(args, kwargs)
            return func(*args, **kwargs)  # a view or a look at metadata: no bytes touched
        if self.to_name:
            self.name_pending()
        reads: list[list[Any]] = []
        writes: list[list[Any]] = []
        bases: set[int] = set()
        cuda_index = None
        nargs = len(args)
        for i, key, written in plan.args:
            value = args[i] if i < nargs else kwargs.get(key)
            if value is None:
                continue
            for t in _tensors(value):
                if t.is_cuda:
                    space = E.DEVICE
                    if cuda_index is None:
                        cuda_index = t.device.index
                else:
                    space = E.HOST
                base = t.untyped_storage().data_ptr()
                bases.add(base)
                if space == E.HOST and base not in self.pinned:
                    continue  # pageable: the host's private memory
                if not plan.no_work:
                    (writes if written else reads).extend(_spans(space, t))
        if cuda_index is None and not reads and not writes and not plan.fresh_returns:
            return func(*args, **kwargs)  # the host's work on its private (pageable) memory
        frame = program_frame(2)
        site = site_of(frame)
        sid = None
        meta: dict[str, Any] = {"site": site, "op": plan.name, "source": "torch",
                                "t": perf_counter_ns()}
        if threading.current_thread() is not self.main_thread:
            meta["thread"] = thread_name()
        event = None
        if cuda_index is not None:
            sid = self.raw_stream(cuda_index)
            self._seen_stream(sid, frame)
            if not plan.no_work:
                event = ["op", sid, self._kind(plan, args), reads, writes, meta]
                if self.amplifier is not None:
                    delay = self.amplifier.wants(site, event[2])
                    if delay is not None:
                        self.delay(delay, cuda_index, sid)
        elif (reads or writes) and not plan.no_work:
            event = ["op", None, "host_write" if writes else "host_read", reads, writes, meta]
        self.local.inflight = event
        try:
            out = func(*args, **kwargs)
        finally:
            emitted = getattr(self.local, "inflight", None) is None
            self.local.inflight = None
        if plan.fresh_returns:
            new = self.outputs(plan, out, bases, frame, site, sid)
            if new is not None:
                spans, cuda_index_out = new
                if event is None and cuda_index_out is not None and not plan.no_work:
                    sid = self.raw_stream(cuda_index_out)  # a factory op: zeros(device=...)
                    self._seen_stream(sid, frame)
                    event = ["op", sid, self._kind(plan, args), reads, [], meta]
                    emitted = False
                elif event is None and spans and not plan.no_work:
                    event = ["op", None, "host_write", reads, [], meta]
                    emitted = False
                if event is not None and not plan.no_work:
                    if emitted:  # the op went out before a synchronize inside it
                        if spans:
                            self.emit(["op", event[1], event[2], [], spans, meta])
                        return out
                    event[4] = writes + spans
        if event is not None and not emitted:
            self.emit(event)
        return out

    def delay(self, delay: Delay, index: int, sid: int) -> None:
        """Queue ``delay`` on the current stream of device ``index`` (the op's own), as
        ``torch.cuda._sleep``'s spin of clock cycles, counted at the rate measured here."""
        assert self.amplifier is not None
        torch = self.torch
        try:
            rate = self.cycles_per_us.get(index)
            if rate is None:
                rate = self.cycles_per_us[index] = self.calibrate(index)
                self.emit(["note", f"delays: the spin kernel counts {rate:.0f} clock cycles "
                                   f"a microsecond on cuda:{index} (measured)"])
            with torch.cuda.device(index):
                torch.cuda._sleep(max(1, int(delay.us * rate)))
        except Exception as exc:  # a delay that cannot be queued must not stop the program
            self.amplifier.failed(delay, repr(exc))
            return
        self.amplifier.queued(delay, sid)

    def calibrate(self, index: int) -> float:
        """Clock cycles a microsecond of ``torch.cuda._sleep``'s spin, on a stream of its own
        (the program's queued work is not waited for) and unwatched. The fastest of three
        rounds: a round the program's kernels held back reads slow."""
        torch = self.torch
        self.on = False
        try:
            with torch.cuda.device(index):
                stream = torch.cuda.Stream()
                best = 0.0
                with torch.cuda.stream(stream):
                    for cycles in (100_000, 1_000_000, 1_000_000):
                        begin = torch.cuda.Event(enable_timing=True)
                        end = torch.cuda.Event(enable_timing=True)
                        begin.record(stream)
                        torch.cuda._sleep(cycles)
                        end.record(stream)
                        end.synchronize()
                        us = begin.elapsed_time(end) * 1000.0
                        if us > 0:
                            best = max(best, cycles / us)
        finally:
            self.on = True
        if best <= 0:
            raise RuntimeError("the spin kernel took no measurable time")
        return best

    def _kind(self, plan: _Plan, args: tuple[Any, ...]) -> str:
        if plan.kind == "kernel":
            return "kernel:" + plan.name
        if plan.kind == "scalar":
            return "copy_dtoh"
        # A copy: named by where it reads and writes (copy_ is dst.copy_(src)).
        if plan.name == "copy_" and len(args) >= 2:
            src, dst = args[1], args[0]
            return f"copy_{'d' if src.is_cuda else 'h'}to{'d' if dst.is_cuda else 'h'}"
        src = args[0] if args else None
        return "copy_dtoh" if src is not None and getattr(src, "is_cuda", False) else "copy_htod"

    def outputs(self, plan: _Plan, out: Any, bases: set[int], frame: FrameType | None,
                site: str | None, sid: int | None) -> tuple[list[list[Any]], int | None] | None:
        """New memory among an op's returns: its allocation events (emitted now, before the
        op), and the spans the op wrote there (none for an op that only allocates)."""
        torch = self.torch
        results = out if isinstance(out, (tuple, list)) else (out,)
        spans: list[list[Any]] = []
        cuda_index = None
        for t in results:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            base = storage.data_ptr()
            if base == 0 or base in bases:
                continue  # no bytes, or an input's storage returned unannotated (a view)
            if t.is_cuda:
                space = E.DEVICE
                cuda_index = t.device.index if cuda_index is None else cuda_index
                known = self.live
            elif plan.kind == "copy" or plan.name in ("_pin_memory", "pin_memory") or \
                    base in self.pinned or _pins(plan, t):
                if not t.is_pinned():
                    continue
                space, known = E.HOST, self.pinned
            else:
                continue
            if base not in known:
                meta = {"what": _what(t), "name": None, "site": site, "source": "torch",
                        "stream": sid}
                known[base] = meta
                self.emit(["alloc", space, base, storage.nbytes(), meta])
                if frame is not None:
                    self.to_name.append((meta, frame, base))
            if not plan.no_work:
                spans.extend(_spans(space, t))
        return spans, cuda_index

    def record_stream(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        t = args[0] if args else kwargs.get("self")
        s = args[1] if len(args) > 1 else kwargs.get("s")
        if t is None or s is None or not t.is_cuda:
            return
        cuda = self.torch.cuda
        sid = s.cuda_stream if isinstance(s, cuda.Stream) else cuda.Stream(
            stream_id=s.stream_id, device_index=s.device_index,
            device_type=s.device_type).cuda_stream
        self._seen_stream(sid, program_frame(3))
        self.recorded.setdefault(t.untyped_storage().data_ptr(), set()).add(sid)

    # ---- the GPU trace callbacks ---------------------------------------------------------------
    def _edge(self) -> tuple[FrameType | None, str | None]:
        self.flush_inflight()
        if self.to_name:
            self.name_pending()
        frame = program_frame(3)
        return frame, site_of(frame)

    def _seen_stream(self, sid: int, frame: FrameType | None) -> None:
        if sid not in self.streams:
            self.stream(sid, frame)

    def on_stream_creation(self, sid: int) -> None:
        if self.on:
            self.stream_sites[sid] = site_of(program_frame(2))

    def on_event_creation(self, eid: int) -> None:
        if self.on:
            self.emit(["event", eid, {"site": site_of(program_frame(2)), "source": "torch"}])

    def on_event_record(self, eid: int, sid: int) -> None:
        if self.on:
            frame, site = self._edge()
            self._seen_stream(sid, frame)
            self.emit(["record", eid, sid, site])

    def on_event_wait(self, eid: int, sid: int) -> None:
        if self.on:
            frame, site = self._edge()
            self._seen_stream(sid, frame)
            self.emit(["wait", eid, sid, site])

    def on_free(self, ptr: int) -> None:
        if self.on and ptr in self.live:
            _, site = self._edge()
            del self.live[ptr]
            streams = sorted(self.recorded.pop(ptr, ()))
            self.emit(["free", E.DEVICE, ptr, {"site": site, "streams": streams,
                                               "source": "torch"}])

    def on_sync_device(self) -> None:
        if self.on:
            _, site = self._edge()
            self.emit(["sync_device", site])
            self.sink.flush()

    def on_sync_stream(self, sid: int) -> None:
        if self.on:
            frame, site = self._edge()
            self._seen_stream(sid, frame)
            self.emit(["sync_stream", sid, site])
            self.sink.flush()

    def on_sync_event(self, eid: int) -> None:
        if self.on:
            _, site = self._edge()
            self.emit(["sync_event", eid, site])
            self.sink.flush()

    def host_read(self, t: Any, depth: int) -> None:
        """``tolist``/``numpy`` of a pinned tensor: the host reads its bytes."""
        if not self.on or t.is_cuda:
            return
        base = t.untyped_storage().data_ptr()
        if base in self.pinned:
            self.flush_inflight()
            frame = program_frame(depth)
            meta: dict[str, Any] = {"site": site_of(frame), "op": "host read",
                                    "t": perf_counter_ns(),
                                    "source": "torch"}
            self.emit(["op", None, "host_read", _spans(E.HOST, t), [], meta])


def _pins(plan: _Plan, t: Any) -> bool:
    """Whether an op may have made pinned memory (``pin_memory=True``)."""
    return plan.name.startswith(("empty", "zeros", "ones", "full", "new_"))


def install(sink: E.Sink, amplifier: Amplifier | None = None) -> Callable[[], None]:
    """Capture the program's PyTorch work into ``sink`` from now on, queueing the delays
    ``amplifier`` asks for; returns what stops it."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    import torch.cuda._gpu_trace as trace

    cap = _Capture(sink)
    cap.amplifier = amplifier

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            if not cap.on:
                return func(*args, **(kwargs or {}))
            return cap.dispatch(func, args, kwargs or {})

    torch._C._activate_gpu_trace()
    trace.register_callback_for_stream_creation(cap.on_stream_creation)
    trace.register_callback_for_event_creation(cap.on_event_creation)
    trace.register_callback_for_event_record(cap.on_event_record)
    trace.register_callback_for_event_wait(cap.on_event_wait)
    trace.register_callback_for_memory_deallocation(cap.on_free)
    trace.register_callback_for_device_synchronization(cap.on_sync_device)
    trace.register_callback_for_stream_synchronization(cap.on_sync_stream)
    trace.register_callback_for_event_synchronization(cap.on_sync_event)

    patched: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        patched.append((owner, name, original))
        setattr(owner, name, make(original))

    def event_query(original: Any) -> Any:
        def query(self: Any) -> bool:
            done = original(self)
            if cap.on:
                _, site = cap._edge()
                cap.emit(["query", self.cuda_event, bool(done), site])
            return done
        return query

    def stream_query(original: Any) -> Any:
        def query(self: Any) -> bool:
            done = original(self)
            if cap.on and done:  # all the stream's work is done: as a synchronize orders
                frame, site = cap._edge()
                cap._seen_stream(self.cuda_stream, frame)
                cap.emit(["sync_stream", self.cuda_stream, site])
            return done
        return query

    def host_reader(original: Any) -> Any:
        def read(self: Any, *a: Any, **k: Any) -> Any:
            cap.host_read(self, 2)
            return original(self, *a, **k)
        return read

    def graph_replay(original: Any) -> Any:
        def replay(self: Any, *a: Any, **k: Any) -> Any:
            if cap.on:
                cap.emit(["note", "the program replayed a CUDA graph (torch.cuda.CUDAGraph."
                                  "replay): its kernels run as one launch that no source "
                                  "sees; what they read and write is not checked"])
            return original(self, *a, **k)
        return replay

    patch(torch.cuda.Event, "query", event_query)
    patch(torch.cuda.Stream, "query", stream_query)
    patch(torch.Tensor, "tolist", host_reader)
    patch(torch.Tensor, "numpy", host_reader)
    if hasattr(torch.cuda, "CUDAGraph"):
        patch(torch.cuda.CUDAGraph, "replay", graph_replay)

    # Each thread the program starts enters a mode of its own (modes are per thread).
    def bootstrap(original: Any) -> Any:
        def run(self: Any) -> None:
            with _Mode():
                original(self)
        return run

    patch(threading.Thread, "_bootstrap_inner", bootstrap)
    mode = _Mode()
    mode.__enter__()
    sink.emit(["note", "PyTorch: kernels that do not go through PyTorch's dispatcher (Triton "
                       "kernels launched directly, custom extensions' own launches) are not "
                       "seen; a kernel that reads through an index is taken to read the whole "
                       "tensor it indexes; numpy views of pinned tensors are seen only where "
                       ".numpy() makes them"])

    def uninstall() -> None:
        cap.flush_inflight()
        if cap.to_name:
            cap.name_pending()
        cap.on = False
        mode.__exit__(None, None, None)
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)

    uninstall.capture = cap  # type: ignore[attr-defined]  # for tests: the source's state
    return uninstall
