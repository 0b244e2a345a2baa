"""The PyTorch source's state and its reading of each op: what an op's arguments and results
touch, on which stream, and what the GPU trace's callbacks say (:class:`Capture`).

:mod:`harness.capture.torch_source` hooks it into PyTorch (the dispatch mode, the callbacks,
the patched calls) and says, in its docstring, how ops are read.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns
from types import FrameType
from typing import Any

from harness.capture import events as E
from harness.capture import spin
from harness.capture.amplify import Amplifier, Delay
from harness.capture.sites import (is_own_code, names_in, program_frame, site_of,
                                   thread_name, variable_for)
from harness.capture.source import Failures
from harness.capture.torch_collectives import Collectives
from harness.capture.torch_graphs import Graphs
from harness.capture.torch_mode import decomposes
from harness.capture.torch_ops import (SLOW_NS, SLOWEST_KEPT, Pending, Plan, byte_spans,
                                       given, tensors_in, what_of)


class _Local(threading.local):
    """Per thread: the op being run, not yet emitted. A class attribute, so that reading it
    in a thread that ran no op raises and clears nothing (see ``Capture._edge``)."""

    inflight: list[Any] | None = None



class Capture:
    """The source's state, shared by every thread's mode and by the trace callbacks."""

    def __init__(self, sink: E.Sink) -> None:
        import torch
        self.torch = torch
        self.Tensor = torch.Tensor
        # Tensor types whose bytes are their own storage's: any other type is a subclass the
        # capture does not read (it sees the plain tensors inside it).
        self.plain = frozenset({torch.Tensor, torch.nn.Parameter})
        self.strided = torch.strided
        self.sink = sink
        self.emit = sink.emit
        self.on = True
        self.guard = Failures(sink.emit, "the PyTorch source")
        self.plans: dict[int, Plan] = {}  # id(op) -> its plan (which keeps the op alive)
        self.streams: set[int] = set()
        self.stream_sites: dict[int, str | None] = {}
        self.live: dict[int, dict[str, Any]] = {}  # device storage base -> its alloc's meta
        self.pinned: dict[int, dict[str, Any]] = {}  # pinned storage base -> its alloc's meta
        # Pinned base -> stream -> the event the host allocator's record stands for, recorded
        # after that stream's last copy from or into the block.
        self.pinned_events: dict[int, dict[int, str]] = {}
        self.allocator_events: set[str] = set()  # the host allocator's, said so far
        self.recorded: dict[int, set[int]] = {}  # device storage base -> record_stream sids
        self.devices: dict[Any, int | None] = {}  # a device= argument -> its CUDA index
        self.to_name: list[tuple[dict[str, Any], FrameType, int]] = []
        self.local = _Local()
        self.raw_stream = torch._C._cuda_getCurrentRawStream
        self.main_ident = threading.main_thread().ident
        self.amplifier: Amplifier | None = None
        # What the capture cost the program: ops seen, ns of its own code, its longest pause.
        self.ops = 0
        self.own_ns = 0
        self.max_own_ns = 0
        self.max_site: str | None = None
        self.slow: list[list[Any]] = []  # [ns, site, op] of the first ops over SLOW_NS
        self.ready: set[int] = set()  # devices whose current stream was asked for once
        self.collectives: Collectives | None = None  # where torch.distributed is
        self.graphs = Graphs(self)  # the CUDA graphs it captures and replays
        self.unannotated: dict[str, int] = {}  # extension ops whose writes are not known
        self.higher_order: dict[str, int] = {}  # torch.cond, scan, ...: run, inside unseen
        # () where this PyTorch has none: isinstance of nothing is False.
        self.HigherOrderOperator = getattr(torch._ops, "HigherOrderOperator", ())

    # ---- names -------------------------------------------------------------------------------
    def name_pending(self) -> None:
        """Give the tensors made since the last call the program's names for them, from the
        frames that made them (by now the assignment has run), while their allocation events
        are still held by the sink."""
        pending, self.to_name = self.to_name, []
        strided = self.strided
        names: dict[int, dict[Any, str]] = {}  # id(frame) -> storage base -> name
        for meta, frame, base in pending:
            found = names.get(id(frame))
            if found is None:
                found = names[id(frame)] = names_in(
                    frame, self.plain, lambda t: t.untyped_storage().data_ptr()
                    if t.layout is strided else None)
            meta["name"] = found.get(base)

    def name_when_quiet(self) -> None:
        """The sink is about to write while the program is quiet (a serving loop between two
        requests): the tensors it made last get their names now, not at its next op. From
        the sink's own thread; the program's threads are idle by then (none emitted for a
        while), and one that wakes meanwhile costs at most a tensor's name."""
        if self.to_name:
            self.name_pending()

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

    # ---- tensors -----------------------------------------------------------------------------
    def memory(self, t: Any) -> tuple[str, int] | None:
        """Where a tensor's storage is, as (space, its first byte), or None for a tensor whose
        bytes are not watched memory: pageable host memory, another device's, a tensor without
        plain strided storage (a subclass, sparse, nested, meta), or no data at all."""
        if type(t) not in self.plain or t.layout is not self.strided:
            return None
        cuda = t.is_cuda
        if not cuda and not (self.pinned and t.is_cpu):
            return None  # another device's (meta, say), or the host's while none is pinned
        try:
            base = t.untyped_storage().data_ptr()
        except RuntimeError:  # autograd's ZeroTensor: a storage with no bytes to read
            return None
        if base == 0:
            return None
        if cuda:
            return E.DEVICE, base
        return (E.HOST, base) if base in self.pinned else None  # pageable: the host's own

    def device_index(self, device: Any) -> int | None:
        """The CUDA device a ``device=`` argument names, or None for another device."""
        if device in self.devices:
            return self.devices[device]
        torch = self.torch
        d = device if isinstance(device, torch.device) else torch.device(device)
        index = (d.index if d.index is not None else torch.cuda.current_device()) \
            if d.type == "cuda" else None
        if d.type != "cuda" or d.index is not None:  # "cuda" alone follows the current device
            self.devices[device] = index
        return index

    # ---- ops ---------------------------------------------------------------------------------
    def flush_inflight(self) -> None:
        """A callback fired inside an op (a synchronize in ``.item()``): the op comes first."""
        inflight = self.local.inflight
        if inflight is not None:
            self.local.inflight = None
            self.emit(inflight)

    def plan(self, func: Any) -> Plan | None:
        """What ``func``'s schema says, worked out at its first call; None where it cannot be
        read (the op then runs unwatched, counted)."""
        plan = self.plans.get(id(func))  # an op's hash is Python code; its id is not
        if plan is None and isinstance(func, self.HigherOrderOperator):
            # torch.cond, scan, out_dtype, flex_attention run eagerly: PyTorch takes the mode
            # off the stack while one runs, so what it runs inside is not seen (counted).
            self.higher_order[func.name()] = self.higher_order.get(func.name(), 0) + 1
            return None
        if plan is None:
            try:
                plan = self.plans[id(func)] = Plan(func, decomposes(func, self.guard))
            except Exception as exc:
                self.guard.failed(f"the schema of {func}", exc)
        return plan

    def dispatch(self, plan: Plan, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> Any:
        t0 = perf_counter_ns()
        collectives = None  # torch_collectives, where the op is one of c10d's
        try:
            collectives = self.collectives if plan.collective else None
            if collectives is not None:
                pending = None  # said there (outside this try: its errors are its own)
            elif plan.no_work and not plan.fresh_returns:
                if plan.name == "record_stream":
                    self.record_stream(args, kwargs)
                pending = None  # a view or a look at metadata: no bytes touched
            else:
                pending = self.before(plan, args, kwargs, t0)
        except Exception as exc:  # never the program's failure: its op runs unwatched
            self.guard.failed(f"the arguments of {func}", exc)
            pending = None
        if pending is None:
            if collectives is not None:
                return collectives.dispatch(plan, func, args, kwargs)
            self.account(perf_counter_ns() - t0, None)
            return func(*args, **kwargs)
        t1 = perf_counter_ns()
        self.local.inflight = pending.event
        try:
            out = func(*args, **kwargs)  # the program's own errors are its own: not caught
        finally:
            emitted = pending.event is not None and self.local.inflight is None
            self.local.inflight = None
        t2 = perf_counter_ns()
        try:
            if plan.fresh_returns:
                self.after(plan, args, pending, out, emitted)
            elif pending.event is not None and not emitted:
                self.emit(pending.event)
            if pending.pinned:
                self.copied_pinned(pending)
        except Exception as exc:
            self.guard.failed(f"the results of {func}", exc)
            if pending.event is not None and not emitted:
                self.emit(pending.event)  # what the arguments said still holds
        self.account(t1 - t0 + perf_counter_ns() - t2 - pending.lent_ns, pending.site,
                     plan.name)
        return out

    def account(self, ns: int, site: str | None, op: str | None = None) -> None:
        self.ops += 1
        self.own_ns += ns
        if ns > self.max_own_ns:
            self.max_own_ns, self.max_site = ns, site
        if ns > SLOW_NS and len(self.slow) < SLOWEST_KEPT:
            self.slow.append([ns, site, op])

    def current_stream(self, index: int, pending: Pending) -> int:
        """The current stream of device ``index``. The first ask of a device may create the
        program's CUDA context, which its op would have done a moment later: that time is
        the program's, not the capture's (``pending.lent_ns``)."""
        if index in self.ready:
            return self.raw_stream(index)
        t = perf_counter_ns()
        sid = self.raw_stream(index)
        pending.lent_ns += perf_counter_ns() - t
        self.ready.add(index)
        return sid

    def before(self, plan: Plan, args: tuple[Any, ...], kwargs: dict[str, Any], t0: int
               ) -> Pending | None:
        """What an op's arguments say it touches, its stream, and its event (emitted once it
        ran, or when a callback fires inside it); None: nothing watched is touched."""
        if self.to_name:
            self.name_pending()
        if plan.unannotated:
            self.unannotated[plan.qualified] = self.unannotated.get(plan.qualified, 0) + 1
        reads: list[list[Any]] = []
        writes: list[list[Any]] = []
        bases: set[int] = set()
        cuda_index = None
        nargs = len(args)
        Tensor, plain = self.Tensor, self.plain
        for arg in plan.args:
            # given(), inline: this runs for every tensor argument of every op.
            value = args[arg.index] if arg.index < nargs else kwargs.get(arg.name)
            if value is None:
                continue
            for t in (value,) if type(value) in plain else tensors_in(value, Tensor):
                where = self.memory(t)
                if where is None:
                    continue
                if cuda_index is None and where[0] == E.DEVICE:
                    cuda_index = t.get_device()
                space, base = where
                bases.add(base)
                if not plan.no_work:
                    written = arg.written
                    if arg.written_if is not None:  # batch norm's running statistics, say
                        written = bool(given(arg.written_if, args, kwargs))
                    (writes if written else reads).extend(byte_spans(space, t, t.data_ptr()))
        if cuda_index is None and plan.device_at is not None:
            device = given(plan.device_at, args, kwargs)
            if device is not None:
                cuda_index = self.device_index(device)  # zeros(device=), .to("cuda")
        host = cuda_index is None and not reads and not writes
        if host and not plan.fresh_returns:
            return None  # the host's work on its private (pageable) memory
        # Pinned results come of pin_memory(), pin_memory=True, and copies off the device.
        pins = plan.pins or (plan.pin_memory_at and bool(kwargs.get("pin_memory"))) or (
            plan.kind == "copy" and cuda_index is not None)
        meta: dict[str, Any] = {"site": None, "op": plan.name, "source": "torch", "t": t0}
        if host and not pins:
            # Most likely the host's private work again, with new tensors in pageable memory:
            # the program's line is looked for only if a result turns out watched after all.
            pending = Pending(reads, writes, bases, None, None, meta)
            pending.placed = False
            return pending
        frame = program_frame(1)
        site = meta["site"] = site_of(frame)
        if threading.get_ident() != self.main_ident:
            meta["thread"] = thread_name()
        pending = Pending(reads, writes, bases, frame, site, meta)
        pending.pins = pins
        if cuda_index is not None:
            sid = pending.sid = self.current_stream(cuda_index, pending)
            if sid not in self.streams:
                self.stream(sid, frame)
            pending.pinned = [base for base in bases if base in self.pinned]
            if not plan.no_work:
                pending.event = ["op", sid, self._kind(plan, args, kwargs), reads, writes, meta]
                if self.amplifier is not None:
                    delay = self.graphs.delay_for(site, pending.event[2])
                    if delay is not None:
                        self.delay(delay, cuda_index, sid)
        elif (reads or writes) and not plan.no_work:
            pending.event = ["op", None, "host_write" if writes else "host_read", reads, writes,
                             meta]
        return pending

    def place(self, pending: Pending) -> None:
        """Find the program's line of an op found watched only by its results (before()
        finds the others' at once: the same walk out of the stack)."""
        pending.placed = True
        frame = pending.frame = program_frame(1)
        pending.site = pending.meta["site"] = site_of(frame)
        if threading.get_ident() != self.main_ident:
            pending.meta["thread"] = thread_name()

    def after(self, plan: Plan, args: tuple[Any, ...], pending: Pending, out: Any,
              emitted: bool) -> None:
        """An op's new memory among its results: allocation events first, then the op with
        what it wrote there (or, where the op went out before a synchronize inside it, the
        writes on their own)."""
        spans = self.outputs(plan, out, pending)
        event = pending.event
        if event is None and spans and not plan.no_work:
            # No CUDA argument: an op that made CUDA memory all the same (its stream found
            # from the result), or a CPU op that made pinned memory (pin_memory()).
            event = ["op", pending.sid, "host_write" if pending.sid is None else
                     self._kind(plan, args, {}), pending.reads, [], pending.meta]
            emitted = False
        if event is None:
            return
        if emitted:  # the op went out before a synchronize inside it
            if spans:
                self.emit(["op", event[1], event[2], [], spans, pending.meta])
            return
        if spans:
            event[4] = pending.writes + spans
        self.emit(event)

    def delay(self, delay: Delay, index: int, sid: int) -> None:
        """Queue ``delay`` on the current stream of device ``index`` (the op's own)."""
        assert self.amplifier is not None
        spin.queue(self.torch, self.amplifier, self.emit, delay, index, sid)

    def _kind(self, plan: Plan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if plan.kind == "kernel":
            return plan.kernel
        if plan.kind == "scalar":
            return "copy_dtoh"
        # A copy, named by where it reads and where it writes: copy_ is dst.copy_(src), the
        # others read their first argument (and _to_copy writes where device= says).
        src, dst = (args[1], args[0]) if plan.name == "copy_" else (
            args[0], args[1] if len(args) > 1 else None)
        src_cuda = bool(getattr(src, "is_cuda", False))
        if dst is not None:
            dst_cuda = bool(getattr(dst, "is_cuda", False))
        else:
            device = kwargs.get("device")
            dst_cuda = src_cuda if device is None else self.device_index(device) is not None
        return f"copy_{'d' if src_cuda else 'h'}to{'d' if dst_cuda else 'h'}"

    def outputs(self, plan: Plan, out: Any, pending: Pending) -> list[list[Any]]:
        """New memory among an op's returns: its allocation events (emitted now, before the
        op), and the spans the op wrote there (none for an op that only allocates)."""
        results = out if isinstance(out, (tuple, list)) else (out,)
        spans: list[list[Any]] = []
        for t in results:
            if type(t) not in self.plain or t.layout is not self.strided:
                continue
            cuda = t.is_cuda
            if not cuda and not (pending.pins or self.pinned):
                continue  # the host's pageable memory, as nearly every CPU result is
            try:
                storage = t.untyped_storage()
                base = storage.data_ptr()
            except RuntimeError:  # autograd's ZeroTensor: a storage with no bytes to read
                continue
            if base == 0 or base in pending.bases:
                continue  # no bytes, or an input's storage returned unannotated (a view)
            if not cuda and not (pending.pins or base in self.pinned):
                continue
            if not pending.placed:
                self.place(pending)
            if cuda:
                space, known = E.DEVICE, self.live
                if pending.sid is None:
                    pending.sid = self.current_stream(t.device.index, pending)
                    self._seen_stream(pending.sid, pending.frame)
            elif t.is_cpu and t.is_pinned():
                space, known = E.HOST, self.pinned
                if base in known:
                    self.pinned_again(base, pending.site)
                if pending.sid is not None:
                    pending.pinned.append(base)  # a copy off the device into it
            else:
                continue
            if base not in known:
                meta = {"what": what_of(t), "name": None, "site": pending.site,
                        "source": "torch", "stream": pending.sid}
                known[base] = meta
                alloc = ["alloc", space, base, storage.nbytes(), meta]
                if pending.frame is not None and is_own_code(pending.frame.f_code):
                    self.sink.hold(alloc)  # its name is filled in at the next op or wait
                    self.to_name.append((meta, pending.frame, base))
                else:
                    self.emit(alloc)
            if not plan.no_work:
                spans.extend(byte_spans(space, t, t.data_ptr()))
        return spans

    def copied_pinned(self, pending: Pending) -> None:
        """A stream op copied from or into pinned blocks: PyTorch's caching host allocator
        records an event on the stream for each (after the copy), and hands the block out
        again only once it completed. Said as an event recorded after the op."""
        assert pending.sid is not None
        for base in pending.pinned:
            # One event per block and stream, recorded again at each copy: the latest record
            # on a stream covers the earlier ones there (a new event per copy would be one
            # more for the watching side to keep at each copy of a long run).
            eid = f"host-allocator-{base:x}-{pending.sid:x}"
            if eid not in self.allocator_events:
                self.allocator_events.add(eid)
                self.emit(["event", eid, {"name": "of the pinned memory allocator", "site":
                                          pending.site, "source": "torch"}])
            self.emit(["record", eid, pending.sid, pending.site])
            self.pinned_events.setdefault(base, {})[pending.sid] = eid

    def pinned_again(self, base: int, site: str | None) -> None:
        """A pinned block handed out again: the host allocator found the events of its copies
        completed, so the host is ordered after those copies, and the old owner is gone."""
        del self.pinned[base]
        for eid in self.pinned_events.pop(base, {}).values():
            self.emit(["sync_event", eid, site])
        self.emit(["free", E.HOST, base, {"site": site, "streams": [], "source": "torch"}])

    def record_stream(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        t = args[0] if args else kwargs.get("self")
        s = args[1] if len(args) > 1 else kwargs.get("s")
        if t is None or s is None or self.memory(t) is None or not t.is_cuda:
            return
        cuda = self.torch.cuda
        sid = s.cuda_stream if isinstance(s, cuda.Stream) else cuda.Stream(
            stream_id=s.stream_id, device_index=s.device_index,
            device_type=s.device_type).cuda_stream
        self._seen_stream(sid, program_frame(1))
        self.recorded.setdefault(t.untyped_storage().data_ptr(), set()).add(sid)

    # ---- the GPU trace callbacks ---------------------------------------------------------------
    def _edge(self) -> tuple[FrameType | None, str | None]:
        # No naming here: a free may fire while an exception unwinds the program's frames
        # (its temporaries released with the error pending), and reading a frame's locals
        # then can clear that error. Names are given at the next op or wait.
        self.flush_inflight()
        frame = program_frame(1)
        return frame, site_of(frame)

    def _wait_edge(self) -> tuple[FrameType | None, str | None]:
        """A host wait: the sink writes out after it, so the tensors made so far get their
        names first."""
        edge = self._edge()
        if self.to_name:
            self.name_pending()
        return edge

    def _seen_stream(self, sid: int, frame: FrameType | None) -> None:
        if sid not in self.streams:
            self.stream(sid, frame)

    def on_stream_creation(self, sid: int) -> None:
        self.stream_sites[sid] = site_of(program_frame(1))

    def on_event_creation(self, eid: int) -> None:
        self.emit(["event", eid, {"site": site_of(program_frame(1)), "source": "torch"}])

    def on_event_record(self, eid: int, sid: int) -> None:
        frame, site = self._edge()
        self._seen_stream(sid, frame)
        self.emit(["record", eid, sid, site])

    def on_event_wait(self, eid: int, sid: int) -> None:
        frame, site = self._edge()
        self._seen_stream(sid, frame)
        self.emit(["wait", eid, sid, site])

    def on_free(self, ptr: int) -> None:
        if ptr in self.live:
            _, site = self._edge()
            del self.live[ptr]
            streams = sorted(self.recorded.pop(ptr, ()))
            self.emit(["free", E.DEVICE, ptr, {"site": site, "streams": streams,
                                               "source": "torch"}])

    def on_sync_device(self) -> None:
        _, site = self._wait_edge()
        self.emit(["sync_device", site])
        self.sink.flush()

    def on_sync_stream(self, sid: int) -> None:
        frame, site = self._wait_edge()
        self._seen_stream(sid, frame)
        self.emit(["sync_stream", sid, site])
        self.sink.flush()

    def on_sync_event(self, eid: int) -> None:
        _, site = self._wait_edge()
        self.emit(["sync_event", eid, site])
        self.sink.flush()

    def host_read(self, t: Any) -> None:
        """``tolist``/``numpy`` of a pinned tensor: the host reads its bytes."""
        where = self.memory(t)
        if where is not None and where[0] == E.HOST:
            self.flush_inflight()
            frame = program_frame(1)
            meta: dict[str, Any] = {"site": site_of(frame), "op": "host read",
                                    "t": perf_counter_ns(), "source": "torch"}
            self.emit(["op", None, "host_read", byte_spans(E.HOST, t, t.data_ptr()), [], meta])

    def stats(self) -> list[Any]:
        """What the capture cost and missed, for the run's record."""
        return ["stats", {"source": "torch", "ops": self.ops, "own_ns": self.own_ns,
                          "max_own_ns": self.max_own_ns, "max_site": self.max_site,
                          "slow": self.slow,
                          "failures": dict(self.guard.counts)}]
