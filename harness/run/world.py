"""The world a scenario's trials run in: its streams, pool, host buffers and execution table,
built once per device and kept from trial to trial, as an engine keeps its streams and pool
(building it per trial would add allocations, which synchronize the device, to every race
window)."""

from __future__ import annotations

from dataclasses import dataclass

import kvcore
from harness.lang.footprint import host_bytes
from harness.limits import COUNTED_READS_MAX
from harness.lang.model import Scenario, Step, Variant
from kvcore.device.kernels import FIRST_BYTES
from kvcore.device.program import Live
from kvcore.device.sim import UNWRITTEN


@dataclass
class _HostBuffer:
    view: kvcore.HostKVAllocationView
    pages: int
    readback: bool  # written by the device (copy_to_host): zeroed before every trial


CHECK_STREAM = "(check)"
"""The stream a check reads device pages back on: its own, so that a check adds no ordering to
the scenario's streams (and no scenario can name it)."""


class World:
    """The device-side world of one scenario variant on one device: its streams (with the
    scenario's names, so the op log and findings speak them), the pool, the execution table,
    and the pinned arena its world buffers and its host_alloc'd buffers come from."""

    def __init__(self, scenario: Scenario, device: kvcore.Device,
                 variant: Variant | None = None, *, scrubs: bool = False,
                 poison: bool = False) -> None:
        self.device = device
        self.streams: dict[str, kvcore.device.Stream] = {}
        for spec in (scenario.streams_of(variant) if variant else scenario.streams):
            if spec.kind == "legacy":
                device.rename_stream(device.legacy_stream, spec.name)
                self.streams[spec.name] = device.legacy_stream
            else:
                self.streams[spec.name] = device.create_stream(
                    spec.name, blocking=spec.kind == "blocking", priority=spec.priority)
        self.check_stream = device.create_stream(CHECK_STREAM)
        self.context = kvcore.DeviceContext(
            device, stream=self.streams.get("compute", self.check_stream),
            transfer_stream=self.streams.get("transfer", self.check_stream))
        steps = scenario.steps_of(variant.name) if variant else scenario.steps
        # Bytes no step writes or expects: what a stale read of a scrubbed or poisoned page
        # returns cannot be mistaken for data. Worked out only where they are used (a
        # simulated world is built every trial).
        unused = _unused_bytes(steps) if scrubs or poison else []
        self.poison = unused.pop() if poison else None
        spec = scenario.pool
        self.pool = kvcore.DeviceKVPagePool(self.context, spec.geometry(), spec.pages,
                                            poison=self.poison, allocator=spec.allocator)
        self.layout = kvcore.plan_host_kv_page_layout(self.pool.geometry)
        rows = spec.max_pages_per_row or spec.pages
        self.table = kvcore.KVExecutionTablePool(self.pool, spec.table_rows, rows)
        sizes = _host_buffer_sizes(steps)
        allocs = [int(s.args.get("pages", 1)) for s in steps  # type: ignore[arg-type]
                  if s.op == "host_alloc"]
        scratch = max([spec.pages, 1])
        # Room for every buffer at once, each rounded up to the arena's granule (a page of
        # an odd size would otherwise leave the last buffer without room).
        stride = self.layout.page_stride
        total = sum(host_bytes(pages, stride) for pages in
                    [*(pages for pages, _ in sizes.values()), scratch, *allocs])
        self.arena = kvcore.HostKVArena(self.context, total, [self.layout])
        self.host: dict[str, _HostBuffer] = {}
        for name, (pages, readback) in sizes.items():
            self.host[name] = _HostBuffer(self.view(pages, f"buffer {name}"), pages, readback)
        self.scratch = self.view(scratch, "the check's readback")
        # One int32 slot per counting read_table step (the loader keeps them to this many).
        self.counters = device.alloc(4 * COUNTED_READS_MAX, name="table-read-counts")
        self.counters_host = device.alloc_host(4 * COUNTED_READS_MAX,
                                               name="table-read-counts-host")
        # And per slot, where a counting attention keeps the first page it found wrong.
        self.firsts = device.alloc(FIRST_BYTES * COUNTED_READS_MAX, name="attention-firsts")
        self.firsts_host = device.alloc_host(FIRST_BYTES * COUNTED_READS_MAX,
                                             name="attention-firsts-host")
        self.scrubs = scrubs
        self.settling = False  # a scrub was issued and nobody has waited for it yet
        self.events: dict[str, kvcore.device.Event] = {}
        # What a page holds before a trial writes it: the last scrub's byte on the GPU, the
        # simulated device's initial byte on sim. A check that finds it says so. (A scrub at
        # a trial's end sets it for the next trial: see begin.)
        self.unwritten: int | None = UNWRITTEN if device.kind == "sim" else None
        self._unwritten_next = self.unwritten
        self.scrubbed = 0
        self._scrub_bytes = unused
        self._scrub_byte = Live(0)
        if scrubs:
            self.scrub()
            self.begin()

    def scrub(self, wait: str = "now") -> None:
        """Fill every page with a byte that no step of the scenario writes or expects (another
        one each time): the next trial's reads of a page it did not write then see bytes they
        cannot mistake for data. A world that serves many trials (on the GPU) does this at its
        start and at the end of each trial, once nothing reads the pages any more. ``wait``:
        ``now``, the host waits for it; ``later``, the next trial's :meth:`begin` does (by then
        it has landed, and the wait costs the call alone); ``check``, the caller's next wait
        for the check stream does."""
        # Its byte changes every time: a device program issuing this again picks the next
        # one (a call of its own) and sets it (a Live byte).
        self.device.reissued(self._next_scrub, wait)
        if self.pool.poison is not None:
            # The poison of the trial's last releases runs on the pool's own stream, still
            # writing these pages: the scrub must not race it.
            self.context.synchronize()
        self.device.memset(self.pool.buffer, 0, self.pool.buffer.nbytes, self._scrub_byte,
                           self.check_stream)
        if wait == "now":
            self.context.synchronize()

    def _next_scrub(self, wait: str) -> None:
        """The scrub's next byte, and who waits for it (see :meth:`scrub`)."""
        value = self._scrub_bytes[self.scrubbed % len(self._scrub_bytes)]
        self.scrubbed += 1
        self._unwritten_next = self._scrub_byte.value = value
        self.settling = wait == "later"

    def begin(self) -> None:
        """A trial begins: with the device idle (the last scrub waited for, if nobody has yet),
        and its pages holding the last scrub's byte."""
        if self.settling:
            self.settling = False
            self.context.synchronize()
        self.unwritten = self._unwritten_next

    def event(self, name: str) -> kvcore.device.Event:
        """The scenario's event ``name``: made once per world, as an engine makes its events
        once (an event is recorded again by each trial that records it)."""
        event = self.events.get(name)
        if event is None:
            event = self.events[name] = self.device.create_event(name)
        return event

    def state_key(self) -> tuple[object, ...]:
        """What a trial's device calls depend on besides the scenario (see
        DeviceKVPagePool.state_key): the pool, the arena, the execution table, the events made
        so far, and the owners the op log knows."""
        log = self.device.oplog
        return (self.pool.state_key(), self.arena.state_key(), self.table.state_key(),
                tuple(self.events), tuple(log.labels.live()) if log.active else ())

    def view(self, pages: int, name: str | None = None) -> kvcore.HostKVAllocationView:
        allocation = self.arena.allocate(self.layout, pages, name=name)
        assert allocation is not None  # sized above
        return self.arena.writable_view(allocation)

    def stream(self, name: str) -> kvcore.device.Stream:
        return self.streams[name]


def _unused_bytes(steps: tuple[Step, ...]) -> list[int]:
    """The bytes 1-255 that no step fills, compares or expects, in order."""
    used = {int(s.args["byte"]) for s in steps if "byte" in s.args}  # type: ignore[call-overload]
    return [b for b in range(1, 256) if b not in used]


def _host_buffer_sizes(steps: tuple[Step, ...]) -> dict[str, tuple[int, bool]]:
    """Each world buffer the steps name (pinned buffers not from host_alloc): its size in
    pages and whether the device writes it."""
    lease_pages: dict[str, int] = {}
    allocated: set[str] = {str(s.args["buffer"]) for s in steps if s.op == "host_alloc"}
    lists: dict[str, int] = {}  # page list -> entries
    sizes: dict[str, tuple[int, bool]] = {}
    for step in steps:
        a = step.args
        if step.op == "materialize" and step.id:
            lease_pages[step.id] = int(a["pages"])  # type: ignore[arg-type]
        elif step.op == "host_fill" and str(a["buffer"]) not in allocated:
            name = str(a["buffer"])
            pages = int(a.get("pages", 1))  # type: ignore[arg-type]
            old = sizes.get(name, (0, False))
            sizes[name] = (max(old[0], pages), old[1])
        elif step.op == "page_list":
            lists[str(a["buffer"])] = lease_pages.get(str(a["lease"]), 1)
            if str(a["buffer"]) not in allocated:
                old = sizes.get(str(a["buffer"]), (0, False))
                sizes[str(a["buffer"])] = (max(old[0], 1), old[1])
        elif step.op in ("copy_to_host", "gather"):
            name = str(a["dst"] if step.op == "copy_to_host" else a["to"])
            if name in allocated:
                continue
            pages = lease_pages.get(str(a["src"]), 1) if step.op == "copy_to_host" else \
                lists.get(str(a["page_list"]), 1)
            old = sizes.get(name, (0, True))
            sizes[name] = (max(old[0], pages), True)
    return sizes
