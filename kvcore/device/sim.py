"""The simulated device: CUDA's ordering semantics in host memory, in virtual time.

Buffers are numpy arrays. Every stream-ordered op gets its start and end time when it is issued:
it starts once it is visible to the device, its stream's previous op has ended, the events it waits
on have completed, and (legacy stream vs blocking streams) the implicit barriers are met. Its
effects (copy chunks, kernel reads and writes) are queued at their virtual times and applied
lazily, in time order, whenever the host next looks (any API call advances the host clock to
"now" first). So, as on the GPU: with no delay, writes land in issue order; with a delay on one
stream, that stream's write lands last; a reader racing a chunked copy can see torn data.

Durations come from :class:`CostModel` (bandwidths measured on an H200), perturbed by a seeded
jitter so the same seed always gives the same schedule.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from kvcore.defects import Defects
from kvcore.device.base import Device, DeviceInfo
from kvcore.device.handles import DEVICE, Buffer, Event, Stream
from kvcore.device.graph import START, Graph
from kvcore.device.schedule import Schedule
from kvcore.device.kernels import (
    ATTENTION_ASSERT_LINE,
    FIRST_BYTES,
    GENERATION_BYTES,
    NO_FIRST,
    RESULT_BYTES,
    TABLE_ASSERT_LINE,
    TABLE_ENTRY_BYTES,
    Attend,
    Delay,
    Fill,
    Gather,
    GatherPages,
    Kernel,
    ReadTable,
    RowKernel,
    Scatter,
    ScatterPages,
    Verify,
    WritePages,
    first_key,
    Touch,
)
from kvcore.errors import DeviceFaultError, DeviceUsageError

UNWRITTEN = 0xA5
"""The byte simulated device memory holds until something writes it."""

NEVER = 1 << 62
"""The end time of an op that never ends (a hung kernel)."""


@dataclass(frozen=True)
class CostModel:
    """How long things take on the simulated device, in nanoseconds and bytes per nanosecond.

    Defaults follow what was measured on the H200 here: pinned host<->device copies 55.5 GB/s,
    device-to-device 4.27 TB/s counting bytes read plus written, 3.7 us per 64 KiB copy issued
    one page at a time (issue-bound), 1.6 us for an empty stream sync, about 21 us for a bare
    trial of two 64 KiB copies, a verify kernel and two syncs. A small copy lands before a kernel
    launched right after it on another stream starts: unamplified, the legacy-stream table
    publish raced its non-blocking reader 0 times in 200 there, so the race needs a delay on the
    producer stream to show, as on the GPU.

    The host's own time counts too: a scenario's step costs the harness microseconds on the GPU
    (Python, the op log the race detector reads), and a trial step by step and a reissued one
    differ. A run's trials there are issued again from the device program an earlier clean trial
    captured, after the first one or two; a simulated device, new every trial, stands in for them
    with the harness's host timed as a reissued trial's (``reissued_step_ns`` a step), the rest at
    ``host_step_ns``. Measured on the H200 (the executor alone, 30 trials each) with a kernel of
    N us on a non-blocking stream and a copy of what it writes on the legacy stream in the next step
    (pytorch-2702): step by step, none manifested at 10 us and 27 at 20 us; reissued, none at 3 us,
    20 of 28 at 5 us, all at 10 us; one step more between them (miopen-3299): step by step none at
    20 us and 29 at 40 us, reissued none at 5 us and 24 of 28 at 10 us. These defaults give 0, 0,
    30, 30 and 0, 0, 30, 30 step by step, and 0 at 5 us, 29 at 10 us (pytorch-2702) and 25 at 10 us
    (miopen-3299) reissued. Under a run's worker and race detector pytorch-2702's edges held
    (reissued 0 at 5 us, 25 at 10 us) and miopen-3299's reissued one moved out (2 at 20 us, 28 at
    40 us): near an edge the GPU's rate moves from run to run. With these a small copy lands before
    the host's next step touches its buffer, as there (host-overwrite and pinned-read races: 0 of 50
    without a delay). A --sweep of 20 trials a delay agrees with the GPU's on mini-sglang-103,
    cross-stream-race, release-fence, vllm-36013, and pytorch-2702 and miopen-3299 at a kernel of
    20 us (most trials manifest from 20 us on); it is off on cutorch-222 (the GPU: 15 of 20 at
    20 us; here none until 100 us) and on stale-row-write, measured while its catalog steps were
    still run step by step on the GPU, each costing the host more than a plain step (the GPU:
    none until 200 us; here 7 at 20 us, all at 50 us). A host thread starts in about 62 us
    there (median, CPython) and two threads hand over in about 11 us.

    Under a run's worker the host does more before each wait: the op log's blocking hooks (the
    flight recorder writing the records since the last wait) run first, and the device works on
    meanwhile. On the H200's host a flush took 10 us for one record, 17 for 3, 30 for 6, 46 for
    12, 83 for 24 (``flush_ns`` plus ``flush_record_ns`` a record); a CUDA graph of 20 us of
    kernel launched just before the host synchronized another stream and read the graph's output
    was read 110 to 140 us after the launch there (median 130 us; 0 of 20 trials read it early),
    and 7 to 27 us after it here before the flush was counted.
    """

    host_device_bytes_per_ns: float = 55.5
    device_bytes_per_ns: float = 4270.0 / 2  # each byte is read and written
    host_memcpy_bytes_per_ns: float = 10.0
    copy_issue_ns: int = 3700
    launch_issue_ns: int = 2500
    event_issue_ns: int = 600
    host_access_ns: int = 150
    sync_ns: int = 1600
    dma_latency_ns: int = 2000
    device_copy_latency_ns: int = 2000
    kernel_latency_ns: int = 1000
    kernel_min_ns: int = 1500
    host_step_ns: int = 12_000
    reissued_step_ns: int = 2500
    flush_ns: int = 7000
    flush_record_ns: int = 3200
    thread_start_ns: int = 62_000
    thread_switch_ns: int = 11_000
    jitter: float = 0.1
    chunk_bytes: int = 4096
    max_chunks: int = 16


class _Stream:
    """The simulator's state of one stream: when its last op ends."""

    __slots__ = ("last_end",)

    def __init__(self) -> None:
        self.last_end = 0


class _Event:
    __slots__ = ("completes_at",)

    def __init__(self) -> None:
        self.completes_at: int | None = None


class SimDevice(Device):
    """A deterministic simulated GPU (see the module docstring)."""

    kind = "sim"

    def __init__(self, *, defects: Defects = Defects(), seed: int = 0,
                 cost: CostModel = CostModel(), schedule: Schedule | None = None) -> None:
        self.cost = cost
        self.rng = random.Random(seed)
        self.schedule = schedule
        self.ops_issued = 0  # stream ops so far: the index a schedule names ops by
        self.now = 0  # the host's virtual clock, ns
        self._effects: list[tuple[int, int, Callable[[], None]]] = []
        self._tiebreak = itertools.count()
        self._step_ns = cost.host_step_ns  # what the harness's next step costs the host
        self._graph_cost: tuple[CostModel, CostModel] | None = None  # cost, its graph nodes'
        self._flushed = 0  # the op log's last record when the host last blocked
        super().__init__(defects=defects, seed=seed)

    # ---- virtual time --------------------------------------------------------------------------
    def _clock_ns(self) -> int:
        return self.now

    def _vary(self, ns: float) -> int:
        """A duration with the seeded jitter applied: the only randomness in the simulator."""
        j = self.cost.jitter
        return max(0, int(ns * (1.0 + self.rng.uniform(-j, j))))

    def _advance(self, ns: int = 0) -> None:
        """Apply every device effect due by the host's 'now', then move the host clock on."""
        self._drain(self.now)
        self.now += ns

    def _drain(self, until: int) -> None:
        effects = self._effects
        while effects and effects[0][0] <= until:
            _, _, apply = heapq.heappop(effects)
            apply()
            if self.fault is not None:
                self._effects.clear()
                raise self.fault
        if self.fault is not None:
            raise self.fault

    def _at(self, when: int, apply: Callable[[], None]) -> None:
        if when < NEVER:
            heapq.heappush(self._effects, (when, next(self._tiebreak), apply))

    def _schedule(self, stream: Stream, duration: int, *, latency: int = 0, issue: int = 0,
                  after: int = 0) -> tuple[int, int]:
        """Place an op on ``stream`` and return when it runs, [begin, end).

        The host spends ``issue`` ns in the API call, and the op is visible to the device when
        the call returns. It begins ``latency`` after that (latencies of successive ops
        overlap, as a DMA engine pipelines them), but not before its stream's previous op ends,
        the events it waits on (``after``) complete, or the legacy stream's implicit barriers
        with blocking streams are met."""
        self._advance(issue)
        state: _Stream = stream.handle  # type: ignore[assignment]
        held = self.schedule.delay_ns(self.ops_issued) if self.schedule else 0
        self.ops_issued += 1
        begin = max(self.now + self._vary(latency) + held, state.last_end, after)
        if stream.legacy:
            for other in self.streams:
                if other.blocking and not other.legacy:
                    begin = max(begin, other.handle.last_end)  # type: ignore[attr-defined]
        elif stream.blocking:
            begin = max(begin, self.legacy_stream.handle.last_end)  # type: ignore[attr-defined]
        end = NEVER if duration >= NEVER or begin >= NEVER else begin + duration
        state.last_end = end
        return begin, end

    # ---- backend hooks -------------------------------------------------------------------------
    def _legacy_handle(self) -> object:
        return _Stream()

    def _do_stream(self, blocking: bool, priority: int) -> object:
        # A priority is a scheduling hint with no ordering guarantee: the simulator, which
        # models only what CUDA guarantees, ignores it.
        return _Stream()

    def _do_alloc(self, nbytes: int, space: str) -> object:
        # Device memory starts as garbage on a GPU; a fixed pattern keeps the simulator
        # deterministic while still not looking like valid data.
        return np.full(nbytes, UNWRITTEN if space == DEVICE else 0, np.uint8)

    def _do_event(self) -> object:
        return _Event()

    def _do_record(self, event: Event, stream: Stream) -> tuple[int, int]:
        begin, end = self._schedule(stream, 0, issue=self.cost.event_issue_ns)
        event.handle.completes_at = end  # type: ignore[attr-defined]
        return begin, end

    def _do_wait(self, stream: Stream, event: Event) -> tuple[int, int]:
        completes = event.handle.completes_at  # type: ignore[attr-defined]
        return self._schedule(stream, 0, issue=self.cost.event_issue_ns, after=completes or 0)

    def _transfer(self, stream: Stream, nbytes: int, host_side: bool,
                  piece: Callable[[int, int], None], *, kernel: bool = False) -> tuple[int, int]:
        """A copy-like op of ``nbytes`` (a copy, memset, or a kernel that moves bytes):
        ``piece(lo, hi)`` moves bytes [lo, hi) as it runs, chunk by chunk, so a concurrent
        reader can see it half done."""
        c = self.cost
        rate = c.host_device_bytes_per_ns if host_side else c.device_bytes_per_ns
        if kernel:
            latency, issue = c.kernel_latency_ns, c.launch_issue_ns
        else:
            latency = c.dma_latency_ns if host_side else c.device_copy_latency_ns
            issue = c.copy_issue_ns
        data_ns = int(nbytes / rate)
        begin, end = self._schedule(stream, data_ns, latency=latency, issue=issue)
        chunks = max(1, min(c.max_chunks, -(-nbytes // c.chunk_bytes)))
        for i in range(chunks):
            lo, hi = nbytes * i // chunks, nbytes * (i + 1) // chunks
            self._at(begin + data_ns * (i + 1) // chunks, lambda lo=lo, hi=hi: piece(lo, hi))
        return begin, end

    def _do_copy(self, dst: Buffer, dst_off: int, src: Buffer, src_off: int, nbytes: int,
                 stream: Stream) -> tuple[int, int]:
        d, s = _arr(dst), _arr(src)

        def piece(lo: int, hi: int) -> None:
            d[dst_off + lo:dst_off + hi] = s[src_off + lo:src_off + hi]

        return self._transfer(stream, nbytes, DEVICE != dst.space or DEVICE != src.space, piece)

    def _do_copy_2d(self, dst: Buffer, dst_off: int, dst_pitch: int, src: Buffer, src_off: int,
                    src_pitch: int, width: int, height: int, stream: Stream) -> tuple[int, int]:
        d, s = _arr(dst), _arr(src)

        def rows(lo: int, hi: int) -> None:
            # lo/hi count bytes of the packed payload; move whole rows they cover.
            for r in range(lo // max(width, 1), -(-hi // max(width, 1))):
                if r < height:
                    d[dst_off + r * dst_pitch:dst_off + r * dst_pitch + width] = \
                        s[src_off + r * src_pitch:src_off + r * src_pitch + width]

        return self._transfer(stream, width * height, dst.space != src.space, rows)

    def _do_memset(self, dst: Buffer, off: int, nbytes: int, value: int,
                   stream: Stream) -> tuple[int, int]:
        d = _arr(dst)

        def piece(lo: int, hi: int) -> None:
            d[off + lo:off + hi] = value

        return self._transfer(stream, nbytes, False, piece)

    def _do_launch(self, kernel: Kernel, stream: Stream) -> tuple[int, int]:
        c = self.cost
        if isinstance(kernel, Delay):
            duration = NEVER if kernel.us is None else int(kernel.us * 1000)
            return self._schedule(stream, duration, latency=c.kernel_latency_ns,
                                  issue=c.launch_issue_ns)
        elif isinstance(kernel, Fill):
            d = _arr(kernel.dst)
            base, value = kernel.offset, kernel.value

            def fill(lo: int, hi: int) -> None:
                d[base + lo:base + hi] = value

            return self._transfer(stream, kernel.nbytes, False, fill, kernel=True)
        elif isinstance(kernel, Scatter):
            move = _pieces(kernel.chunk, kernel.dst_offsets, scatter=True, dev=_arr(kernel.dst),
                           packed=_arr(kernel.src), packed_off=kernel.src_offset)
            return self._transfer(stream, kernel.chunk * len(kernel.dst_offsets), False, move,
                                  kernel=True)
        elif isinstance(kernel, Gather):
            move = _pieces(kernel.chunk, kernel.src_offsets, scatter=False, dev=_arr(kernel.src),
                           packed=_arr(kernel.dst), packed_off=kernel.dst_offset)
            return self._transfer(stream, kernel.chunk * len(kernel.src_offsets), False, move,
                                  kernel=True)
        elif isinstance(kernel, Touch):
            # It runs its time, then its writes land (what it read is what was there then).
            begin, end = self._schedule(stream, max(int(kernel.us * 1000), c.kernel_min_ns),
                                        latency=c.kernel_latency_ns, issue=c.launch_issue_ns)
            spans = [(_arr(b), off, n) for b, off, n in kernel.write]
            first = None if kernel.value is not None else (
                _arr(kernel.read[0][0]), kernel.read[0][1])

            def land() -> None:
                value = kernel.value if first is None else int(first[0][first[1]])
                for d, off, n in spans:
                    d[off:off + n] = value

            self._at(end - 1 if end > begin else end, land)
            return begin, end
        elif isinstance(kernel, (Verify, ReadTable, WritePages, Attend, GatherPages)):
            begin, end = self._schedule(stream, c.kernel_min_ns, latency=c.kernel_latency_ns,
                                        issue=c.launch_issue_ns)
            check = {Verify: self._verify, ReadTable: self._read_table,
                     WritePages: self._write_pages, Attend: self._attend,
                     GatherPages: self._move_row_pages,
                     ScatterPages: self._move_row_pages}[type(kernel)]
            # The kernel reads what is there when it begins running.
            self._at(begin, lambda: check(kernel))
            return begin, end
        raise DeviceUsageError(f"the simulated device has no kernel {kernel.name!r}")

    @staticmethod
    def _verify(k: Verify) -> None:
        bad = int(np.count_nonzero(_arr(k.src)[k.offset:k.offset + k.nbytes] != k.expected))
        _add_result(_arr(k.result), k.result_offset, bad)

    def _read_table(self, k: ReadTable) -> None:
        raw = _arr(k.table)[k.offset:k.offset + k.entries * TABLE_ENTRY_BYTES]
        entries = raw.view(np.int32).reshape(-1, 2)
        gens = _arr(k.generations)[:k.num_pages * GENERATION_BYTES].view(np.int32)
        pages, wanted = entries[:, 0], entries[:, 1]
        in_range = (pages >= 0) & (pages < k.num_pages)
        current = np.zeros(len(pages), bool)
        current[in_range] = gens[pages[in_range]] == wanted[in_range]
        bad = int(np.count_nonzero(~current))
        if bad and k.assert_on_stale:
            first = int(np.argmin(current))
            self.fault = DeviceFaultError(
                f"device-side assert triggered: kernels.cu:{TABLE_ASSERT_LINE}: read_table: "
                f"entry {first} names page {int(pages[first])} generation {int(wanted[first])}, "
                f"which is out of range or stale",
                cuda_error="CUDA_ERROR_ASSERT",
            )
            return
        _add_result(_arr(k.result), k.result_offset, bad)

    @staticmethod
    def _row_entries(k: RowKernel) -> list[tuple[int, int]]:
        """(entry, page) for each entry of a row kernel's row that names a page in range now
        (what the kernel follows)."""
        raw = _arr(k.table)[k.offset:k.offset + k.entries * TABLE_ENTRY_BYTES]
        pages = raw.view(np.int32).reshape(-1, 2)[:, 0]
        return [(e, int(p)) for e, p in enumerate(pages) if 0 <= p < k.num_pages]

    @classmethod
    def _row_pages(cls, k: RowKernel) -> list[int]:
        return [p for _, p in cls._row_entries(k)]

    def _move_row_pages(self, k: GatherPages) -> None:
        assert k.packed is not None
        pages, packed, n = _arr(k.pages), _arr(k.packed), k.stride
        for e, p in self._row_entries(k):
            at = k.packed_offset + e * n
            if isinstance(k, ScatterPages):
                pages[p * n:(p + 1) * n] = packed[at:at + n]
            else:
                packed[at:at + n] = pages[p * n:(p + 1) * n]

    def _write_pages(self, k: WritePages) -> None:
        pages = _arr(k.pages)
        for p in self._row_pages(k):
            pages[p * k.stride:(p + 1) * k.stride] = k.value

    def _attend(self, k: Attend) -> None:
        pages = _arr(k.pages)
        bad = 0
        first = NO_FIRST
        for e, p in self._row_entries(k):
            page = pages[p * k.stride:(p + 1) * k.stride]
            other = page[page != k.expected]
            if other.size and k.assert_on_mismatch:
                self.fault = DeviceFaultError(
                    f"device-side assert triggered: kernels_data.cu:{ATTENTION_ASSERT_LINE}: "
                    f"attention: page {p} holds bytes other than 0x{k.expected:02X}",
                    cuda_error="CUDA_ERROR_ASSERT")
                return
            if other.size:
                first = min(first, first_key(e, p, int(other.min())))
            bad += int(other.size)
        assert k.result is not None
        _add_result(_arr(k.result), k.result_offset, bad)
        if k.first is not None:
            slot = _arr(k.first)[k.first_offset:k.first_offset + FIRST_BYTES].view(np.uint64)
            slot[0] = min(int(slot[0]), first)

    def _do_graph_end(self, graph: Graph) -> object:
        return None  # the nodes themselves are what a launch runs

    def _do_graph_launch(self, graph: Graph, stream: Stream) -> None:
        # One call issues every node: the host pays one launch, and the nodes are visible to
        # the device as it returns, each after the one before on its branch; a branch runs on a
        # stream of its own, ordered with the others by the launch's edges.
        self._advance(self.cost.launch_issue_ns)
        cost = self.cost
        if self._graph_cost is None or self._graph_cost[0] is not cost:
            self._graph_cost = (cost, dataclasses.replace(
                cost, copy_issue_ns=0, launch_issue_ns=0, event_issue_ns=0))
        self.cost = self._graph_cost[1]
        origin = graph.stream.name
        lanes = {b: stream if b == origin else Stream(-1, b, False, False, _Stream())
                 for b in graph.branches}
        marks = {i: Event(-1, str(i), _Event()) for i in (*graph.plan().marked, START)}
        try:
            self._issue_nodes(graph, lanes, marks, stream)
        finally:
            self.cost = cost

    def _do_host_view(self, buf: Buffer) -> np.ndarray:
        self._advance()
        return _arr(buf)

    def _do_host_step(self) -> None:
        self._advance(self._vary(self._step_ns))

    def _blocking(self) -> None:
        hooks = self.oplog.blocking_hooks
        if not hooks:
            return
        for hook in hooks:
            hook()
        # What the hooks cost the host on the GPU, per record since the host last blocked (a
        # flight recorder writes them): time the device runs on before the wait begins.
        seq = self.oplog.seq
        cost = self.cost
        self._advance(self._vary(cost.flush_ns + cost.flush_record_ns * (seq - self._flushed)))
        self._flushed = seq

    def as_reissued(self) -> None:
        # Not Device.reissue's: a simulated device that keeps its world and is given the program
        # (as tests do) times its steps as they were captured, so that its clock, which follows
        # the calls, shows any call more, less or out of order.
        self._step_ns = self.cost.reissued_step_ns

    def _do_host_thread_switch(self, start: bool) -> None:
        self._advance(self._vary(self.cost.thread_start_ns if start
                                 else self.cost.thread_switch_ns))

    def _do_host_written(self, buf: Buffer, off: int, nbytes: int) -> None:
        self.now += self.cost.host_access_ns + int(nbytes / self.cost.host_memcpy_bytes_per_ns)

    def _wait_until(self, when: int | None) -> None:
        self._advance()
        if when is None:
            return
        if when >= NEVER:
            # A kernel that never ends hangs the host that waits for it, as on a GPU; only the
            # harness's watchdog (which kills the worker process) gets out of this.
            threading.Event().wait()
        self._drain(when)
        self.now = max(self.now, when) + self.cost.sync_ns

    def _do_sync_device(self) -> None:
        self._wait_until(max(s.handle.last_end for s in self.streams))  # type: ignore[attr-defined]

    def _do_sync_stream(self, stream: Stream) -> None:
        self._wait_until(stream.handle.last_end)  # type: ignore[attr-defined]

    def _do_sync_event(self, event: Event) -> None:
        self._wait_until(event.handle.completes_at)  # type: ignore[attr-defined]

    def _do_query(self, event: Event) -> bool:
        # A query costs the host an API call, so a loop of them moves time on.
        self._advance(self.cost.event_issue_ns)
        completes = event.handle.completes_at  # type: ignore[attr-defined]
        if completes is None:
            return True
        if completes <= self.now:
            self._drain(completes)
            return True
        return False

    def info(self) -> DeviceInfo:
        details: dict[str, object] = {"seed": self.seed, "cost_model": asdict(self.cost)}
        if self.schedule is not None:
            details["schedule"] = self.schedule.token
        return DeviceInfo("sim", "simulated device (H200 cost model)", details)


def _arr(buf: Buffer) -> np.ndarray:
    return buf.handle  # type: ignore[return-value]


def _add_result(result: np.ndarray, offset: int, count: int) -> None:
    view = result[offset:offset + RESULT_BYTES].view(np.int32)
    view[0] = view[0] + count


def _pieces(chunk: int, offsets: np.ndarray, *, scatter: bool, dev: np.ndarray,
            packed: np.ndarray, packed_off: int) -> Callable[[int, int], None]:
    """The mover of a scatter (packed -> pages) or gather (pages -> packed) over packed bytes
    [lo, hi), page by page."""

    def move(lo: int, hi: int) -> None:
        for i in range(lo // chunk, -(-hi // chunk)):
            a, b = max(lo, i * chunk), min(hi, (i + 1) * chunk)
            d = int(offsets[i]) + a - i * chunk
            p = packed_off + a
            if scatter:
                dev[d:d + b - a] = packed[p:p + b - a]
            else:
                packed[p:p + b - a] = dev[d:d + b - a]

    return move
