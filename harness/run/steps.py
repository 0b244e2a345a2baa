"""One trial of a step-list scenario: its steps in order, or its host threads interleaved (by a
seeded schedule on the simulated device, by real threads on the GPU: :mod:`harness.run.threads`),
each step's handler by its op, and what the trial leaves to clean up. The checks are
:mod:`harness.run.checks`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import kvcore
from harness.lang import vocabulary as V
from harness.lang.model import Scenario, Step
from harness.results.outcome import Outcome
from kvcore.device.kernels import TOUCH_SPANS_MAX, Delay, Touch, Verify
from kvcore.device.program import Program
from kvcore.device.schedule import Schedule

from harness.run.checks import _Checks, _Corruption
from harness.run.threads import HostThreads, _Deadlock
from harness.run.world import World, _HostBuffer


@dataclass(frozen=True)
class Section:
    """A run of steps on the scenario's own thread (``threads`` empty), or a parallel section:
    each host thread's steps, in order, the threads in the order they first appear."""

    steps: tuple[Step, ...]
    threads: tuple[tuple[str, tuple[Step, ...]], ...] = ()


def sections(steps: tuple[Step, ...]) -> tuple[Section, ...]:
    """Consecutive steps with a ``thread`` form a parallel section; the others run in order."""
    out: list[Section] = []
    run: list[Step] = []
    for step in steps:
        if run and (step.thread is None) != (run[0].thread is None):
            out.append(_section(run))
            run = []
        run.append(step)
    if run:
        out.append(_section(run))
    return tuple(out)


def _section(steps: list[Step]) -> Section:
    if steps[0].thread is None:
        return Section(tuple(steps))
    by: dict[str, list[Step]] = {}
    for step in steps:
        by.setdefault(str(step.thread), []).append(step)
    return Section(tuple(steps), tuple((name, tuple(s)) for name, s in by.items()))


class Trials(Protocol):
    """What a trial's steps read of the executor that runs them (a
    :class:`harness.run.executor.TrialExecutor`), said here so that the steps need not import
    it."""

    scenario: Scenario
    backend: str
    schedule: Schedule | None
    real_threads: bool
    sections: tuple[Section, ...]
    amplified_step: str | None
    last_pool_read: Step | None
    decisions: int  # host-thread decisions of the trial (what explore perturbs)

    def held_steps(self) -> tuple[str, ...]: ...

    def amplifier(self, world: World, before: str) -> None: ...


class _Steps(_Checks):
    """One trial of a step-list scenario."""

    def __init__(self, executor: Trials, world: World, seed: int = 0) -> None:
        self.ex = executor
        self.w = world
        self.seed = seed
        executor.decisions = 0  # counted per trial: a schedule's preemptions name them
        self.current: Step | None = None  # the step running (the last one begun)
        self.host = HostThreads(executor, world.device, seed, self._one, self._exists)
        self.freed: dict[str, _HostBuffer] = {}  # host_free'd buffers another thread may use
        # Who wrote each byte value, for a check's findings: (what, name, step) as recorded,
        # put into words only if a check fails (host steps sit inside race windows).
        self.wrote: list[tuple[int, str, str, Step | None]] = []
        self.leases: dict[str, list[kvcore.DeviceKVPageLease]] = {}
        self.catalogs: dict[str, kvcore.KVConversationCatalog] = {}
        self.events: dict[str, kvcore.device.Event] = {}
        self.allocs: dict[str, _HostBuffer] = {}  # host_alloc'd buffers not freed yet
        self.lists: dict[str, kvcore.PageIndex] = {}  # page lists the host wrote, by buffer
        self.graphs: dict[str, kvcore.device.Graph] = {}  # captured CUDA graphs, by name
        # Kernels that count instead of asserting, a counter slot each: (step, what it says).
        self.counted: list[tuple[str, str, bool]] = []  # (step, says, keeps its first)
        self.idle = False  # every stream is known idle (the trial's last synchronize ran)
        self.capturing: Program | None = None  # the device program this trial is captured in
        # Nothing is in flight on the device since the last synchronize (checks wait for their
        # own reads): the trial's end can scrub the pool at once.
        self.quiet = False
        self.scrubbed = False  # the pool was scrubbed before the cleanup

    def run(self) -> tuple[Outcome, str, str | None, int | None]:
        w = self.w
        for name, buf in w.host.items():
            if buf.readback:
                buf.view.fill(0)
                self.wrote.append((0, "readback", name, None))
        oplog = w.device.oplog
        try:
            for section in self.ex.sections:
                if not section.threads:
                    self._in_order(section.steps)
                elif self.ex.real_threads:
                    self.host.in_parallel(section.threads)
                else:
                    self.host.interleave(section.threads)
            if self.scrubbed and self.quiet:
                pass  # the last check's wait was the scrub's: nothing runs on the device
            elif self.quiet and w.scrubs and w.pool.poison is None:
                # Nothing runs on the device: the scrub can go now, its wait the trial's last
                # synchronize, and the next trial need not wait for it.
                self._scrub("now")
            else:
                w.context.synchronize()
            self.idle = True
            self._mark("idle")
            self._check_counts()
            return Outcome.CLEAN, "", None, None
        except _Corruption as exc:
            return Outcome.CORRUPTION, str(exc), exc.step, None
        except _Deadlock as exc:
            return Outcome.HANG, str(exc), exc.step, None
        except kvcore.DeviceFaultError as exc:
            step = self.current
            exc.gpurace_step = step.label if step else None  # type: ignore[attr-defined]
            raise
        finally:
            oplog.step = oplog.origin = oplog.thread = None
            self._cleanup()

    def _in_order(self, steps: tuple[Step, ...]) -> None:
        """Steps on the scenario's own thread: :meth:`_one` unrolled, since every call here is
        host time inside the race windows."""
        device = self.w.device
        oplog = device.oplog
        oplog.thread = None  # the scenario's own thread
        host_step = device.host_step
        before = self.ex.amplified_step
        handlers, quiet_ops = _HANDLERS, _QUIET
        for step in steps:
            self.current = step
            oplog.step, oplog.origin = step.label, step.origin
            host_step()
            if step.id is not None and step.id == before:
                self.ex.amplifier(self.w, step.id)
            handlers[step.op](self, step)
            if step.op not in quiet_ops:
                self.quiet = False
            elif step.op == "synchronize" and not step.args:
                self.quiet = True

    def _one(self, step: Step) -> None:
        self.current = step
        # Set directly, not through oplog.in_step: a context manager per step is a measurable
        # share of a trial's host time, which sits inside race windows.
        oplog = self.w.device.oplog
        oplog.step, oplog.origin, oplog.thread = step.label, step.origin, step.thread
        self.w.device.host_step()
        self.ex.amplifier(self.w, step.id or "")
        _HANDLERS[step.op](self, step)
        self.quiet = False  # another host thread may have work in flight

    def _exists(self, kind: str, name: str) -> bool:
        """Whether the trial has made ``name`` of ``kind`` (a host thread waits until it has)."""
        if kind == "memory":  # a kernel's: a lease or a pinned buffer
            return self._exists("lease", name) or self._exists("buffer", name)
        if kind == "lease":
            return name in self.leases
        if kind == "catalog":
            return name in self.catalogs
        if kind == "event":
            return name in self.events
        return name in self.allocs or name in self.w.host or name in self.freed

    def _mark(self, name: str) -> None:
        """Name the position the trial has reached in the program it is captured in, if any."""
        if self.capturing is not None:
            self.capturing.mark(name)

    def _cleanup(self) -> None:
        """Leave the world as the trial found it: idle, every page free, every row free."""
        self._mark("cleanup")
        w = self.w
        w.device.abandon_graph()  # a trial that ended inside a capture
        if w.device.fault is not None:
            return
        if not self.idle:
            w.context.synchronize()
        for catalog in self.catalogs.values():
            catalog.leases = [lease for lease in catalog.leases if not lease.released]
            catalog.release()
        held = [lease for group in self.leases.values() for lease in group if not lease.released]
        if held:
            # The device was synchronized above: every use of these pages is done, and a
            # fence would only make the next trial's first use wait for nothing.
            w.pool.release(held, idle=True)
        for buf in self.allocs.values():
            w.arena.free(buf.view.allocation)
        w.arena.reclaim()  # the device is idle: every deferred free is due
        if w.scrubs and not self.scrubbed:
            w.scrub("later")  # the next trial begins by waiting for it (World.begin)

    # ---- steps ---------------------------------------------------------------------------------
    def _materialize(self, s: Step) -> None:
        stream = s.args.get("stream")
        self.leases[str(s.id)] = self.w.pool.materialize(
            int(s.args["pages"]), name=f"lease {s.id}",  # type: ignore[arg-type]
            stream=self.w.stream(stream) if stream is not None else None)

    def _record_stream(self, s: Step) -> None:
        self.w.pool.record_stream(self._handles(s.args["lease"]), self.w.stream(s.args["stream"]))

    def _release(self, s: Step) -> None:
        self.w.pool.release(self.leases[str(s.args["lease"])])

    def _handles(self, lease: object) -> list[kvcore.DeviceKVPageHandle]:
        return [lease_.handle for lease_ in self.leases[str(lease)]]

    def _buffer(self, name: object) -> _HostBuffer:
        """A pinned buffer: one host_alloc'd in this trial, else a world buffer, else one that
        another host thread has freed already (its bytes may be someone else's by now)."""
        key = str(name)
        return self.allocs.get(key) or self.w.host.get(key) or self.freed[key]

    def _host_fill(self, s: Step) -> None:
        a = s.args
        view = self._buffer(a["buffer"]).view
        value = int(a["byte"])  # type: ignore[arg-type]
        self.wrote.append((value, "fill", str(a["buffer"]), s))
        if "offset" in a:
            start = view.allocation.offset + int(a["offset"])  # type: ignore[call-overload]
            self.w.device.host_fill(view.buffer, start, int(a.get("length", 1)),  # type: ignore
                                    value)
        elif "page" in a:
            page = a["page"]
            for p in page if isinstance(page, tuple) else (page,):
                view.fill(value, page=int(p))  # type: ignore[arg-type]
        else:
            view.fill(value)

    def _host_alloc(self, s: Step) -> None:
        name, pages = str(s.args["buffer"]), int(s.args.get("pages", 1))  # type: ignore
        self.allocs[name] = _HostBuffer(self.w.view(pages, f"buffer {name}"), pages, False)
        self.freed.pop(name, None)

    def _host_free(self, s: Step) -> None:
        after = s.args.get("after", ())
        names = after if isinstance(after, tuple) else (after,)
        buf = self.allocs.pop(str(s.args["buffer"]))
        self.freed[str(s.args["buffer"])] = buf
        self.w.arena.free(buf.view.allocation, after=tuple(self.events[str(n)] for n in names))

    def _copy_from_host(self, s: Step) -> None:
        a = s.args
        handles = self._handles(a["dst"])
        self.w.pool.copy_from_host(self._buffer(a["src"]).view, handles,
                                   self.w.stream(str(a["stream"])))
        # A page list copied into a lease is a device index (a block table): kernels that
        # follow it read its entries from the lease's first page where they run, whatever
        # has landed there by then.
        listed = self.lists.get(str(a["src"]))
        dst = str(a["dst"])
        if listed is None:
            self.lists.pop(dst, None)
            return
        pool = self.w.pool
        index = kvcore.PageIndex(pool, pool.buffer, pool.page_offset(handles[0]),
                                 pool.page_stride)
        index.pages = listed.pages
        self.lists[dst] = index

    def _copy_to_host(self, s: Step) -> None:
        a = s.args
        self.w.pool.copy_to_host(self._handles(a["src"]), self._buffer(a["dst"]).view,
                                 self.w.stream(str(a["stream"])))

    def _copy_page(self, s: Step) -> None:
        a = s.args
        self.w.pool.copy_page(self._handles(a["src"])[0], self._handles(a["dst"])[0],
                              self.w.stream(str(a["stream"])))

    def _zero_pages(self, s: Step) -> None:
        self.wrote.append((0, "zero", str(s.args["lease"]), s))
        self.w.pool.zero_pages(self._handles(s.args["lease"]), self.w.stream(str(s.args["stream"])))

    def _catalog(self, s: Step) -> None:
        self.catalogs[str(s.id)] = kvcore.KVConversationCatalog(self.w.table, str(s.id))

    def _retain(self, s: Step) -> None:
        self.catalogs[str(s.args["catalog"])].retain(self.leases[str(s.args["lease"])])

    def _release_catalog(self, s: Step) -> None:
        self.catalogs[str(s.args["catalog"])].release()

    def _bind(self, s: Step) -> None:
        self.catalogs[str(s.args["catalog"])].bind()

    def _activate(self, s: Step) -> None:
        self.catalogs[str(s.args["catalog"])].activate(self.w.stream(str(s.args["stream"])))

    _publish = _activate

    def _read_table(self, s: Step) -> None:
        catalog = self.catalogs[str(s.args["catalog"])]
        asserting = bool(s.args.get("assert", True))
        offset = self._counter(s, asserting, "the table reader saw {count} stale or "
                                             "out-of-range entries")
        self.w.table.read(catalog.rows[0], max(1, len(catalog.leases)),
                          self.w.stream(str(s.args["stream"])), result=self.w.counters,
                          assert_on_stale=asserting, result_offset=offset)

    def _page_list(self, s: Step) -> None:
        name = str(s.args["buffer"])
        view = self._buffer(name).view
        listing = kvcore.PageIndex(self.w.pool, view.buffer, view.page_offset(0),
                                   view.layout.page_stride)
        listing.write(self._handles(s.args["lease"]))
        self.lists[name] = listing

    def _kv_write(self, s: Step) -> None:
        value = int(s.args["byte"])  # type: ignore[arg-type]
        stream = self.w.stream(str(s.args["stream"]))
        if "page_list" in s.args:
            self.wrote.append((value, "kv_write", f"page list {s.args['page_list']}", s))
            self._follow(s, stream).write_pages(value, stream)
            return
        catalog = self.catalogs[str(s.args["catalog"])]
        self.wrote.append((value, "kv_write", f"catalog {s.args['catalog']}'s table row", s))
        self.w.table.write_pages(catalog.rows[0], max(1, len(catalog.leases)), value, stream)

    def _attention(self, s: Step) -> None:
        asserting = bool(s.args.get("assert", True))
        expected = int(s.args["byte"])  # type: ignore[arg-type]
        stream = self.w.stream(str(s.args["stream"]))
        follows = f"page list {s.args['page_list']}" if "page_list" in s.args else \
            f"catalog {s.args['catalog']}'s table row"
        offset = self._counter(s, asserting, (
            f"attention through {follows} read {{count}} bytes that are not 0x{expected:02X} in "
            "the pages it names: another owner's data"), first=True)
        # Where a counting attention keeps the first page it found wrong (its slot's own).
        first = {"first": self.w.firsts, "first_offset": offset * 2} if not asserting else {}
        if "page_list" in s.args:
            self._follow(s, stream).attend(
                expected, stream, result=self.w.counters, result_offset=offset,
                assert_on_mismatch=asserting, **first)
            return
        catalog = self.catalogs[str(s.args["catalog"])]
        self.w.table.attend(catalog.rows[0], max(1, len(catalog.leases)), expected, stream,
                            result=self.w.counters, result_offset=offset,
                            assert_on_mismatch=asserting, **first)

    def _gather(self, s: Step) -> None:
        view = self._buffer(s.args["to"]).view
        stream = self.w.stream(str(s.args["stream"]))
        self._follow(s, stream).gather(view.buffer, view.page_offset(0), stream)

    def _scatter(self, s: Step) -> None:
        view = self._buffer(s.args["from"]).view
        stream = self.w.stream(str(s.args["stream"]))
        self._follow(s, stream).scatter(view.buffer, view.page_offset(0), stream)

    def _follow(self, s: Step, stream: kvcore.device.Stream) -> kvcore.PageIndex:
        """The page list a kernel on ``stream`` follows; one in a lease (a device index) is
        read from the lease's pages, so the stream waits for their release fences first, as
        for any pool op."""
        name = str(s.args["page_list"])
        if name in self.leases:
            self.w.pool.use(self._handles(name), stream)
        return self.lists[name]

    def _kernel(self, s: Step) -> None:
        """A kernel of the scenario's own: its leases' pages and buffers as spans, eight of
        each a launch (a kernel over more is launched again on its stream, in order), its
        duration on the first."""
        reads = self._spans(s.args.get("reads", ()))
        writes = self._spans(s.args.get("writes", ()))
        # Without a byte it writes what it read: whose that is, the check traces back itself.
        value = int(s.args["byte"]) if "byte" in s.args else None  # type: ignore[call-overload]
        for item in s.args.get("writes", ()) if value is not None else ():  # type: ignore
            name = V.part_name(item)
            kind = "lease" if name in self.leases else "buffer"
            self.wrote.append((value, "kernel", f"{kind} {name}", s))
        stream = self.w.stream(str(s.args["stream"]))
        named = dict.fromkeys(V.part_name(item) for item in (  # type: ignore[misc]
            *s.args.get("reads", ()), *s.args.get("writes", ())))  # type: ignore[misc]
        for name in named:  # in the step's order: the same waits every run
            if name in self.leases:  # after the pages' release fences, as pool ops are
                self.w.pool.use(self._handles(name), stream)
        us = float(s.args.get("us", 0.0))  # type: ignore[arg-type]
        label = str(s.id or "kernel")
        n = TOUCH_SPANS_MAX
        for i in range(0, max(len(reads), len(writes), 1), n):
            self.w.device.launch(Touch(tuple(reads[i:i + n]), tuple(writes[i:i + n]), value,
                                       us if i == 0 else 0.0, label), stream)

    def _spans(self, names: object) -> list[tuple[kvcore.device.Buffer, int, int]]:
        """The bytes of leases (a span per run of adjacent pages) and pinned buffers, or of
        the parts named of them (a span per page touched)."""
        spans: list[tuple[kvcore.device.Buffer, int, int]] = []
        pool = self.w.pool
        for item in names:  # type: ignore[attr-defined]
            if isinstance(item, dict):
                spans += self._part_spans(item)
            elif str(item) in self.leases:
                spans += [(pool.buffer, off, n) for off, n in pool.byte_runs(self._handles(item))]
            else:
                buf = self._buffer(item)
                spans.append((buf.view.buffer, buf.view.page_offset(0),
                              buf.pages * buf.view.layout.page_stride))
        return spans

    def _part_spans(self, part: dict[str, object]) -> list[tuple[kvcore.device.Buffer, int, int]]:
        """A part's bytes: its pages, or its byte range cut at the pages it crosses (a lease's
        pages need not be adjacent in the pool)."""
        if "lease" in part:
            pool, handles = self.w.pool, self._handles(part["lease"])
            buffer, stride = pool.buffer, pool.page_stride
            starts = [pool.page_offset(h) for h in handles]
        else:
            held = self._buffer(part["buffer"])
            buffer, stride = held.view.buffer, held.view.layout.page_stride
            starts = [held.view.page_offset(p) for p in range(held.pages)]
        if "page" in part:
            pages = part["page"] if isinstance(part["page"], tuple) else (part["page"],)
            return [(buffer, starts[int(p)], stride) for p in pages]  # type: ignore[call-overload]
        lo = int(part["offset"])  # type: ignore[call-overload]
        hi = lo + int(part["length"])  # type: ignore[call-overload]
        return [(buffer, starts[p] + max(lo - p * stride, 0),
                 min(hi, (p + 1) * stride) - max(lo, p * stride))
                for p in range(lo // stride, (hi - 1) // stride + 1)]

    def _read_pinned(self, s: Step) -> None:
        name = str(s.args["buffer"])
        buf = self._buffer(name)
        expected = int(s.args["byte"])  # type: ignore[arg-type]
        offset = self._counter(s, False, (
            f"a kernel reading buffer {name} in place saw {{count}} bytes that are not "
            f"0x{expected:02X}: the host changed them under it"))
        view = buf.view
        self.w.device.launch(Verify(view.buffer, view.page_offset(0),
                                    buf.pages * view.layout.page_stride, expected,
                                    self.w.counters, offset),
                             self.w.stream(str(s.args["stream"])))

    def _counter(self, s: Step, asserting: bool, says: str, first: bool = False) -> int:
        """The counter slot a counting kernel adds to (zeroed first, on its stream), and what
        a non-zero count says ({count} in ``says``); 0 for a kernel that asserts instead. With
        ``first``, the slot's first-mismatch record (8 bytes at twice the offset in
        ``firsts``) is set to all ones too."""
        if asserting:
            return 0
        slot = len(self.counted)
        stream = self.w.stream(str(s.args["stream"]))
        self.w.device.memset(self.w.counters, slot * 4, 4, 0, stream)
        if first:
            self.w.device.memset(self.w.firsts, slot * 8, 8, 0xFF, stream)
        self.counted.append((s.label, says, first))
        return slot * 4

    def _record_event(self, s: Step) -> None:
        name = str(s.args["event"])
        event = self.events[name] = self.w.event(name)
        self.w.device.record_event(event, self.w.stream(str(s.args["stream"])))

    def _wait_event(self, s: Step) -> None:
        self.w.device.wait_event(self.w.stream(str(s.args["stream"])),
                                 self.events[str(s.args["event"])])

    def _synchronize(self, s: Step) -> None:
        if "stream" in s.args:
            self.w.device.synchronize_stream(self.w.stream(str(s.args["stream"])))
        elif "event" in s.args:
            self.w.device.synchronize_event(self.events[str(s.args["event"])])
        else:
            self.w.context.synchronize()

    def _event_query(self, s: Step) -> None:
        event = self.events[str(s.args["event"])]
        if s.args.get("poll", False):
            self.w.device.poll_event(event)
        else:
            self.w.device.query_event(event)

    def _graph_capture(self, s: Step) -> None:
        self.w.device.begin_graph(self.w.stream(str(s.args["stream"])), str(s.id))

    def _graph_end(self, s: Step) -> None:
        self.graphs[str(s.args["graph"])] = self.w.device.end_graph()

    def _graph_replay(self, s: Step) -> None:
        self.w.device.launch_graph(self.graphs[str(s.args["graph"])],
                                   self.w.stream(str(s.args["stream"])))

    def _delay(self, s: Step) -> None:
        us = float(s.args["us"])  # type: ignore[arg-type]
        # `us: .inf` is a kernel that never ends: the hang the watchdog must catch.
        self.w.device.launch(Delay(None if math.isinf(us) else us),
                             self.w.stream(str(s.args["stream"])))

    def _scrub(self, wait: str) -> None:
        """The world's scrub, before the cleanup (it waits as ``wait`` says; see World.scrub):
        a program marks where, so a reissued trial that ends before it scrubs in its cleanup,
        as a trial step by step does."""
        self._mark("scrub")
        self.w.scrub(wait)
        self.scrubbed = True


_QUIET = frozenset({"synchronize", "check", "host_fill", "materialize"})
"""Steps after which the device is as idle as before them (a check waits for its own reads);
a synchronize of the device makes it idle."""

_HANDLERS: dict[str, Callable[[_Steps, Step], None]] = {
    op: getattr(_Steps, "_" + op) for op in V.OPS if hasattr(_Steps, "_" + op)}
"""Each step op's handler: looked up once, not by name at every step."""
