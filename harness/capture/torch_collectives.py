"""c10d's collectives, as the stream work they are: the PyTorch source's part for
``torch.distributed``.

A collective (``dist.all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``broadcast``, ``send``/``recv``, ...) passes the dispatcher as a ``c10d`` op, but it does not run
on the current stream. ProcessGroupNCCL runs it on a stream of the process group's own: that
stream waits for the current stream when the collective is issued, the collective reads its
inputs and writes its outputs there, and the current stream is ordered after it only when the
program calls ``work.wait()`` (at once for a blocking call, whose ``wait`` torch.distributed
makes itself; whenever the program chooses with ``async_op=True``). Gloo runs it on a thread of
its own, and ``wait`` blocks the host until it is done. Since PyTorch 2.8 (pytorch/pytorch#150398)
a blocking call (``async_op=False``, an argument of the c10d op from then on) runs on the
current stream itself with NCCL, and hands back no Work: it is said as an op on that stream.

So each collective is said in the capture vocabulary as exactly that: the group's stream (one
per process group and device, named after the group: "nccl stream of group 0 (default_pg) on
cuda:0"), an event recorded on the current stream
that the group's stream waits on, the op on the group's stream, an event recorded after it,
and, at the program's ``Work.wait`` or ``Work.synchronize``, the current stream's wait on that
event (NCCL) or the host's (any other backend). ``Work.is_completed`` is the host's query of the
same event. A tensor read or written before that wait races with the collective, as in
pytorch/pytorch#188655. The streams and events are the source's own numbers (negative: no CUDA
handle is), since PyTorch does not hand out NCCL's.

A collective issued from PyTorch's C++ code (DDP's reducer, a coalesced broadcast) is waited on
there too, where no source sees the wait: it is said as an op on the stream it was issued on,
in the program's order, which may miss a race with it but makes none up, and a note counts
them. Which call came through torch.distributed's Python functions is told by the stack.

The c10d schemas mark no argument as written, so which ones are comes from the arguments'
names (:func:`roles`).
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Iterator
from time import perf_counter_ns
from typing import Any, NamedTuple

from harness.capture import events as E
from harness.capture.sites import program_frame, site_of
from harness.capture.torch_functional import Functional
from harness.capture.torch_ops import ArgAt, Plan, byte_spans, given
from harness.races.kinds import COLLECTIVE

WORKS_KNOWN = 4096
"""Collectives not yet waited for that the source follows (to know their Work again at its
wait); past this, the oldest is forgotten and its wait, if it ever comes, is not seen (a note
says so). A Work the program lets go is forgotten at once."""

_WRITTEN = frozenset({"output_tensors", "output_tensor", "output", "outputs"})
_READ = frozenset({"input_tensors", "input_tensor", "input", "inputs"})
_SENDING = frozenset({"send"})
_RECEIVING = frozenset({"recv_", "recv_any_source_"})


class Role(NamedTuple):
    """What a collective does to one of its tensor arguments."""

    index: int
    name: str
    read: bool
    written: bool


class Shape(NamedTuple):
    """What a c10d op's schema says, worked out once per op: its tensor arguments' roles,
    where its process group is, its name as findings say it (``allreduce``) and its op kind
    (``kernel:c10d.allreduce``)."""

    roles: tuple[Role, ...]
    group: ArgAt | None
    name: str
    kind: str
    async_op: ArgAt | None = None  # the blocking flag, where the op's schema has one


def shape_of(plan: Plan, func: Any) -> Shape:
    arguments = list(enumerate(func._schema.arguments))
    group = next((ArgAt(i, a.name) for i, a in arguments if a.name == "process_group"), None)
    async_op = next((ArgAt(i, a.name) for i, a in arguments if a.name == "async_op"), None)
    name = plan.name.rstrip("_")
    return Shape(roles(plan), group, name, COLLECTIVE + name, async_op)


def blocking(shape: Shape, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the program issued the collective with ``async_op=False`` (False where the
    op's schema has no such argument: a PyTorch before 2.8, or an op without it)."""
    return shape.async_op is not None and given(shape.async_op, args, kwargs) is False


def roles(plan: Plan) -> tuple[Role, ...]:
    """Which of a c10d op's tensor arguments it reads and which it writes: outputs written,
    inputs read, and ``tensors`` (all_reduce, broadcast, reduce: in place) both, but for
    ``send`` (read) and ``recv`` (written)."""
    out = []
    for arg in plan.args:
        if arg.name in _WRITTEN:
            read, written = False, True
        elif arg.name in _READ:
            read, written = True, False
        elif plan.name in _SENDING:
            read, written = True, False
        elif plan.name in _RECEIVING:
            read, written = False, True
        else:
            read = written = True
        out.append(Role(arg.index, arg.name, read, written))
    return tuple(out)


class _Issue(NamedTuple):
    """A collective said up to its op: the event recorded after it, its CUDA device (None:
    host memory), whether its wait is a stream's (NCCL) or the host's, its site, and its
    process group's name."""

    event: int
    device: int | None
    stream_wait: bool
    site: str | None
    group: str


class Issued(NamedTuple):
    """Collectives the program has not waited for yet, with one Work between them (one, or
    those of a coalesced block): a weak reference to the Work's Python object (the program's
    own), the events recorded after them, their CUDA device (None: host memory), and whether
    their wait is a stream's (NCCL) or the host's."""

    work: weakref.ref[Any]
    events: tuple[int, ...]
    device: int | None
    stream_wait: bool


class Collectives:
    """The collectives of one capture (``cap``: the PyTorch source's state)."""

    def __init__(self, cap: Any) -> None:
        self.cap = cap
        self.shapes: dict[Any, Shape] = {}
        self.streams: dict[tuple[str, int | None], int] = {}  # (group, device) -> its stream
        self.issued: dict[int, Issued] = {}  # id of the Work's Python object -> the collective
        self._newest: Any = None  # the last collective's Work, until the program has it
        self.ids = 0  # the source's own streams and events: -1, -2, ...
        self.let_go = 0
        self.unseen = 0  # collectives issued from C++, kept in the program's order
        self.futures = 0  # Works whose future the program took: ordered from then on
        # A group coalescing (between its _start_coalescing and _end_coalescing): the
        # collectives issued there, which the Work _end_coalescing returns stands for.
        self.coalescing: dict[str, list[_Issue]] = {}
        import torch.distributed as dist
        c10d = dist.distributed_c10d
        self.c10d = c10d
        self.functional = Functional(self)
        self.Work = c10d.Work
        self.ProcessGroup = c10d.ProcessGroup
        self.unbox_group = c10d.ProcessGroup.unbox
        self.unbox_work = c10d.Work.unbox

    def _new_id(self) -> int:
        self.ids += 1
        return -self.ids

    def dispatch(self, plan: Plan, func: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        """Run the collective, said as the group's stream work before it runs."""
        if plan.functional:
            return self.functional.dispatch(plan, func, args, kwargs)
        cap = self.cap
        t0 = perf_counter_ns()
        try:
            issue = self._before(plan, func, args, kwargs, t0)
        except Exception as exc:  # never the program's failure: its collective runs unwatched
            cap.guard.failed(f"the arguments of {func}", exc)
            issue = None
        t1 = perf_counter_ns()
        out = func(*args, **kwargs)  # the program's own errors are its own
        t2 = perf_counter_ns()
        if issue is not None:
            try:
                self._after(issue, out)
            except Exception as exc:
                cap.guard.failed(f"the Work of {func}", exc)
        cap.account(t1 - t0 + perf_counter_ns() - t2, None if issue is None else issue.site,
                    plan.name)
        return out

    def _before(self, plan: Plan, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                t0: int) -> _Issue | None:
        """Say the collective up to its op (None: nothing of it is watched, or it was said
        whole, issued from C++)."""
        cap = self.cap
        shape = self.shapes.get(func)
        if shape is None:
            shape = self.shapes[func] = shape_of(plan, func)
        reads: list[list[Any]] = []
        writes: list[list[Any]] = []
        device = None
        group = None if shape.group is None else given(shape.group, args, kwargs)
        for role in shape.roles:
            value = given(role, args, kwargs)
            for t in _tensors(value, cap.Tensor):
                where = cap.memory(t)
                if where is None:
                    continue
                if device is None and where[0] == E.DEVICE:
                    device = t.get_device()
                spans = byte_spans(where[0], t, t.data_ptr())
                if role.read:
                    reads.extend(spans)
                if role.written:
                    writes.extend(spans)
        if not reads and not writes or group is None:
            return None  # no watched memory (a barrier, host tensors): nothing to order
        frame = program_frame(1)
        site = site_of(frame)
        meta: dict[str, Any] = {"site": site, "op": plan.name, "source": "torch", "t": t0}
        pg = self.unbox_group(group)
        if (device is not None and blocking(shape, args, kwargs)
                and self._backend(pg, device) == "nccl"
                and str(pg.group_name) not in self.coalescing):
            # NCCL runs a blocking collective on the current stream: ordered as any op of it.
            cap.emit(["op", self.current(device, frame), shape.kind, reads, writes, meta])
            return None
        if not _through_python_api():
            # Issued from C++ (DDP's reducer, _broadcast_coalesced), which waits on the Work
            # where no source sees it: said where it was issued, in the program's order (what
            # it orders by itself is missed, never a race made up).
            current = None if device is None else self.current(device, frame)
            cap.emit(["op", current, shape.kind, reads, writes, meta])
            self.unseen += 1
            return None
        issue = self.on_group_stream(pg, device, frame, shape.name,
                                     ["op", None, shape.kind, reads, writes, meta])
        block = self.coalescing.get(issue.group)
        if block is not None:
            block.append(issue)
        return issue

    @staticmethod
    def _backend(pg: Any, device: int | None) -> str:
        """The backend that runs a collective of ``pg`` on ``device`` (None: host memory)."""
        backend = str(pg.name())
        # A group made without a backend named has both ("cpu:gloo,cuda:nccl", or just
        # "undefined"): NCCL is the one that runs a CUDA tensor's collective.
        if device is not None and ("nccl" in backend or backend == "undefined"):
            return "nccl"
        return backend

    def on_group_stream(self, pg: Any, device: int | None, frame: Any, name: str,
                        op: list[Any]) -> _Issue:
        """Say ``op`` (a capture ``op`` event, its stream left out) on process group ``pg``'s
        stream for ``device`` (None: host memory), after a wait for the current stream, and
        the event recorded after it, which a wait on the collective waits for."""
        cap = self.cap
        site = op[-1]["site"]
        backend = self._backend(pg, device)
        stream = op[1] = self._stream(pg, backend, device, site)
        what = f"{name} at {site}" if site else name
        if device is not None:
            # The group's stream waits for the work queued before it on the current stream.
            current = self.current(device, frame)
            start = self._event(f"before {what}", site)
            cap.emit(["record", start, current, site])
            cap.emit(["wait", start, stream, site])
        cap.emit(op)
        end = self._event(f"after {what}", site)
        cap.emit(["record", end, stream, site])
        # On a stream-ordered backend (NCCL, UCC) a CUDA collective's wait is the current
        # stream's; gloo's, and any host tensor's, blocks the host.
        return _Issue(end, device, device is not None and backend != "gloo", site,
                      str(pg.group_name))

    def _after(self, issue: _Issue, out: Any) -> None:
        work = out[-1] if isinstance(out, (tuple, list)) else out
        if work is None or issue.group in self.coalescing:
            return  # inside a coalesced block, the block's Work is the one waited on
        # The Python object the program gets for this Work is this one while it is alive: it
        # is held until the program has it (the next collective), then followed weakly, so
        # that the source keeps no Work (and none of its tensors) alive the program let go.
        held = self.unbox_work(work)
        if held is None:  # no Work to wait on later: ordered now, as a blocking call is
            self._ordered_now([issue])
            return
        self._newest = held
        self._follow(held, [issue])

    def _ordered_now(self, issues: list[_Issue]) -> None:
        """Collectives that hand the program no Work: nothing can wait on them later, so the
        program is taken to be ordered after them at once (a race is missed, none made up)."""
        first = issues[0]
        self.wait_for(tuple(i.event for i in issues), first.device, first.stream_wait,
                      program_frame(1))

    def _follow(self, work: Any, issues: list[_Issue]) -> None:
        if len(self.issued) >= WORKS_KNOWN:
            self.issued.pop(next(iter(self.issued)))
            self.let_go += 1
        key = id(work)

        def gone(ref: weakref.ref[Any]) -> None:
            if (known := self.issued.get(key)) is not None and known.work is ref:
                del self.issued[key]

        first = issues[0]
        self.issued[key] = Issued(weakref.ref(work, gone), tuple(i.event for i in issues),
                                  first.device, first.stream_wait)

    def coalescing_started(self, group: Any) -> None:
        """``ProcessGroup._start_coalescing``: the collectives until its end are one block."""
        self.coalescing[str(group.group_name)] = []

    def coalescing_ended(self, group: Any, work: Any) -> None:
        """``ProcessGroup._end_coalescing``: its Work is the block's, a wait on it a wait on
        every collective of the block (NCCL hands the ones inside no Work of their own)."""
        issues = self.coalescing.pop(str(group.group_name), [])
        if not issues:
            return
        if work is None:  # a blocking block (NCCL from PyTorch 2.8 on): ordered already
            self._ordered_now(issues)
        else:
            self._follow(work, issues)

    def future_taken(self, work: Any) -> None:
        """``Work.get_future``: the future's wait (often in C++, a DDP comm hook's) is not
        seen, so the program is taken to be ordered after the collective from here on: a
        race between here and that wait is missed, none is made up."""
        if id(work) in self.issued:
            self.futures += 1
            self.waited(work)

    def _stream(self, pg: Any, backend: str, device: int | None, site: str | None) -> int:
        key = (str(pg.group_name), device)
        sid = self.streams.get(key)
        if sid is None:
            sid = self.streams[key] = self._new_id()
            # Short enough to stay whole as a minimized scenario's stream name.
            desc = getattr(pg, "group_desc", "") or ""
            name = f"{backend} stream of group {key[0]}" + (
                f" ({desc})" if desc and desc != "undefined" else "") + (
                f" on cuda:{device}" if device is not None else "")
            self.cap.emit(["stream", sid, {"blocking": False, "legacy": False, "name": name,
                                           "site": site, "source": "torch"}])
        return sid

    def current(self, device: int, frame: Any) -> int:
        """The current stream of ``device``, announced where the capture has not seen it."""
        sid: int = self.cap.current_stream(device, _Lent())
        self.cap._seen_stream(sid, frame)
        return sid

    def _event(self, name: str, site: str | None) -> int:
        eid = self._new_id()
        self.cap.emit(["event", eid, {"name": name, "site": site, "source": "torch"}])
        return eid

    # ---- the program's calls on a Work -------------------------------------------------------
    def waited(self, work: Any) -> None:
        """``Work.wait`` or ``Work.synchronize``: the program is ordered after the collective
        from here on, by the current stream's wait (NCCL) or the host's."""
        issued = self.issued.get(id(work))
        if issued is None or issued.work() is not work:
            return
        del self.issued[id(work)]
        if self._newest is work:
            self._newest = None
        self.wait_for(issued.events, issued.device, issued.stream_wait, program_frame(1))

    def wait_for(self, events: tuple[int, ...], device: int | None, stream_wait: bool,
                 frame: Any) -> None:
        """The program waited for collectives (the events recorded after them): the current
        stream's wait (NCCL) or the host's."""
        cap = self.cap
        site = site_of(frame)
        if stream_wait and device is not None:
            current = self.current(device, frame)
            for event in events:
                cap.emit(["wait", event, current, site])
        else:
            for event in events:
                cap.emit(["sync_event", event, site])

    def queried(self, work: Any, done: bool) -> None:
        """``Work.is_completed``: what the host saw of the collective."""
        issued = self.issued.get(id(work))
        if issued is None or issued.work() is not work:
            return
        if done:
            self.issued.pop(id(work))
        site = site_of(program_frame(1))
        for event in issued.events:
            self.cap.emit(["query", event, bool(done), site])

    def notes(self) -> list[str]:
        out = self.functional.notes()
        if self.unseen:
            out.append(f"{self.unseen} collectives were issued from PyTorch's C++ code (DDP's "
                       "reducer, coalesced broadcasts), which waits on them unseen: they were "
                       "taken to run in the program's order on the stream they were issued "
                       "on, so a race with them is not looked for")
        if self.futures:
            out.append(f"the program took the future of {self.futures} collectives' works "
                       "(Work.get_future): its wait on a future is not seen, so it was taken "
                       "to be ordered after each collective from there on")
        if self.let_go:
            out.append(f"{self.let_go} collectives were not waited for while {WORKS_KNOWN} "
                       "newer ones were outstanding: a wait on one of them later was not seen")
        return out


class _Lent:
    """Where :meth:`current_stream` puts the time a first look at a device lends the program
    (a collective's accounting does not subtract it)."""

    lent_ns = 0


_C10D_PY = os.path.join("torch", "distributed", "distributed_c10d.py")


def _through_python_api(depth: int = 12) -> bool:
    """Whether the collective was called through torch.distributed's Python functions, which
    hand its Work to the program (``async_op=True``) or wait on it themselves: a frame of
    distributed_c10d.py close above the source's own."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(_C10D_PY):
            return True
        frame = frame.f_back
    return False


def _tensors(value: Any, tensor: type) -> Iterator[Any]:
    """The tensors of an argument: one, a list of them, or a list of lists (all_gather's)."""
    if isinstance(value, tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v, tensor)
