"""What the GPU said during a run: NVML Xid events and kernel-log Xid lines, per trial.

One :class:`GpuWatch` lives for a whole run. NVML events carry no pid, so they are attributed
to a trial by time; kernel-log lines carry the worker's pid, so they are attributed by pid. NVML
is watched from a helper process (:mod:`harness.gpu.watchproc`): the run's parent loads no GPU
library. On the
simulated device there is nothing to watch, and every answer says so.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.gpu.kernlog import KernelLog, KernelXid
from harness.gpu.nvml import XidEvent
from harness.gpu.watchproc import WatcherProcess, time_of_day

XID_GRACE_S = 2.0
"""How long to wait after a crash for its Xid: the driver reports it as it tears the context
down, which can come a little after the worker saw the error."""


@dataclass(frozen=True)
class FatalXid:
    """A GPU-fatal report: the GPU needs attention. NVML names the GPU by UUID (``gpu_uuid``),
    the kernel log by PCI address (``pci``, as the driver wrote it); None where the source
    did not say."""

    xid: int
    meaning: str
    gpu_uuid: str | None
    pci: str | None
    source: str


def same_pci(a: str | None, b: str | None) -> bool:
    """Whether two PCI addresses name one device, however many digits the domain was written
    with (``0000:3b:00`` and ``00000000:3b:00.0`` are one)."""
    def key(text: str) -> tuple[int, str, str] | None:
        parts = text.lower().removeprefix("pci:").split(":")
        try:
            return (int(parts[0], 16), parts[1], parts[2].split(".")[0]) if len(parts) == 3 \
                else None
        except ValueError:
            return None
    return a is not None and b is not None and key(a) is not None and key(a) == key(b)


@dataclass
class TrialXids:
    """The Xids of one trial, for its report."""

    xids: list[dict[str, Any]] = field(default_factory=list)
    kernel_log: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def fatal(self) -> list[dict[str, Any]]:
        return [x for x in self.xids if x["class"] == "gpu-fatal"]


class GpuWatch:
    """NVML and kernel-log watching for one run (see the module docstring)."""

    def __init__(self, backend: str, on_gap: Callable[[str], None] | None = None) -> None:
        self.backend = backend
        self.nvml: WatcherProcess | None = None
        self.klog: KernelLog | None = None
        self._lines: list[KernelXid] = []
        self._fatal_lines: list[KernelXid] = []  # kept whole: a trial takes its own lines
        self.notes: list[str] = []
        self._on_gap = on_gap
        self._klog_gaps: list[str] = []
        self._klog_read = False  # whether the kernel log read at the last poll
        if backend != "cuda":
            self.notes.append("the simulated device has no GPU: no Xids to watch")
            return
        self.nvml = WatcherProcess(on_gap=on_gap)
        if not self.nvml.start():
            self.notes.append(f"NVML Xid events unavailable: {self.nvml.note}")
        self.klog = KernelLog()
        if not self.klog.start():
            self.notes.append(f"kernel log unavailable: {self.klog.note}")
        self._klog_read = self.klog.available

    @property
    def gaps(self) -> list[str]:
        """Each time Xid watching stopped during the run (the NVML helper died or hung, the
        kernel log became unreadable), and whether it came back, in words."""
        return [*(self.nvml.gaps if self.nvml else []), *self._klog_gaps]

    def health(self, gpu: int | str | None = None) -> dict[str, Any]:
        """NVML's snapshot of GPU ``gpu`` (NVML's number or the GPU's UUID; by default the
        workers' GPU)."""
        if self.backend != "cuda":
            return {"available": False, "note": "the simulated device has no GPU health"}
        assert self.nvml is not None  # on cuda the helper is always made (it may not run)
        # The helper takes the snapshot; one that did not start or died takes it here.
        return self.nvml.health(gpu)

    def for_trial(self, pid: int | None, t0: float, crashed: bool,
                  gpu: str | None = None) -> TrialXids:
        """The Xids of a trial that started at ``t0`` (``time.monotonic()``: a wall clock that
        steps mid-run moves no Xid into another trial) in worker ``pid`` on the GPU
        whose UUID is ``gpu`` (NVML events of other GPUs are not its own; None: any GPU);
        after a crash, waits up to XID_GRACE_S for them to arrive."""
        out = TrialXids(note="; ".join(self.notes))
        if self.backend != "cuda":
            return out
        deadline = time.monotonic() + (XID_GRACE_S if crashed else 0.0)
        while True:
            self._poll_klog()
            events = [ev for ev in (self.nvml.events_since(t0 - 0.5) if self.nvml else [])
                      if gpu is None or ev.gpu_uuid in (None, gpu)]
            lines = [x for x in self._lines if pid is not None and x.pid == pid]
            if events or lines or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        # A kernel line belongs to one trial: the next trial of the same worker must not get it.
        self._lines = [x for x in self._lines if x not in lines]
        seen: set[int] = set()
        for ev in events:
            out.xids.append(_from_event(ev, pid))
            seen.add(ev.xid)
        for line in lines:
            out.kernel_log.append(line.line)
            if line.xid not in seen:
                out.xids.append(_from_line(line))
                seen.add(line.xid)
            else:  # the same Xid from both sources: one entry, with the kernel's line
                for x in out.xids:
                    if x["xid"] == line.xid and x["line"] is None:
                        x["line"], x["sources"] = line.line, ["nvml", "kernel-log"]
                        x["source"] = "nvml, kernel-log"
        if not out.xids:
            out.note = "; ".join([*self.notes, "no Xid was reported for this trial"])
        return out

    def fatal_since(self, t0: float) -> list[FatalXid]:
        """GPU-fatal reports since ``t0`` (``time.monotonic()``; NVML's, and every one the
        kernel log printed since
        the run started, which is how a GPU whose NVML events stopped still says so): the GPU
        needs attention."""
        out = [FatalXid(ev.xid, ev.info.meaning if ev.event_type == "xid" else ev.event_type,
                        ev.gpu_uuid, None, "nvml")
               for ev in (self.nvml.events_since(t0) if self.nvml else [])
               if ev.fatal]
        self._poll_klog()
        return out + [FatalXid(x.xid, x.info.meaning, None, x.pci, "kernel-log")
                      for x in self._fatal_lines]

    def _poll_klog(self) -> None:
        if self.klog is not None:
            new = self.klog.poll()
            self._lines.extend(new)
            self._fatal_lines.extend(x for x in new if x.info.fatal)
            if self.klog.available != self._klog_read:  # it stopped reading, or read again
                self._klog_read = self.klog.available
                when = time_of_day()
                self._klog_gap(f"the kernel log reads again since {when}" if self._klog_read
                               else f"the kernel log could not be read at {when} "
                               f"({self.klog.note}): its Xid lines are not seen until it reads "
                               "again")

    def _klog_gap(self, text: str) -> None:
        self._klog_gaps.append(text)
        if self._on_gap is not None:
            self._on_gap(text)

    def stop(self) -> None:
        if self.nvml is not None:
            self.nvml.stop()
        if self.klog is not None:
            self.klog.close()


def _iso(wall: float) -> str:
    return _dt.datetime.fromtimestamp(wall, _dt.timezone.utc).isoformat(timespec="milliseconds")


def _from_event(ev: XidEvent, pid: int | None) -> dict[str, Any]:
    info = ev.info
    return {"xid": ev.xid, "meaning": info.meaning, "class": info.klass, "source": "nvml",
            "sources": ["nvml"], "time": _iso(ev.wall_time), "gpu": ev.gpu_index,
            "event_type": ev.event_type, "pid": pid, "line": None}


def _from_line(line: KernelXid) -> dict[str, Any]:
    info = line.info
    return {"xid": line.xid, "meaning": info.meaning, "class": info.klass,
            "source": "kernel-log", "sources": ["kernel-log"], "time": line.timestamp,
            "gpu": line.pci, "event_type": "xid", "pid": line.pid, "line": line.line}
