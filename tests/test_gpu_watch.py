"""Xid table, kernel-log parsing and reading, and the NVML watcher/snapshot, all without a GPU.

NVML is replaced by a fake module with the same function names; the real pynvml is only used to
check that a machine without the NVML library gives notes, not exceptions.
"""

from __future__ import annotations

import ctypes
import queue
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.gpu import xid as xidmod
from harness.gpu import kernlog
from harness.gpu.kernlog import DmesgReader, KernelLog, LogUnavailable, parse_xid_line
from harness.gpu.nvml import NvmlWatcher, XidEvent, _same_device, health_snapshot, nvml_summary

LINE_43 = "NVRM: Xid (PCI:0000:00:06): 43, pid=516, name=python3, channel 0x0000000a"
LINE_31 = ("NVRM: Xid (PCI:0000:00:06): 31, pid=568, name=python3, channel 0x0000000a, intr "
           "00000000. MMU Fault: ENGINE GRAPHICS GPC1 GPCCLIENT_T1_4 faulted @ 0x0_00000000. "
           "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE")
LINE_79 = ("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
           "GPU has fallen off the bus.")
LINE_13_OLD = "NVRM: Xid (0000:01:00): 13, Graphics Exception: ESR 0x404600=0x80000002"


# -- xid table -------------------------------------------------------------------------------

@pytest.mark.parametrize("number", [13, 31, 43, 45, 68, 109])
def test_application_xids(number: int) -> None:
    info = xidmod.describe(number)
    assert info.klass == "application" and info.meaning and info.xid == number
    assert not xidmod.is_fatal(number) and not info.fatal
    assert number in xidmod.APPLICATION_XIDS


@pytest.mark.parametrize("number", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154])
def test_gpu_fatal_xids(number: int) -> None:
    info = xidmod.describe(number)
    assert info.klass == "gpu-fatal" and info.meaning
    assert xidmod.is_fatal(number) and info.fatal
    assert number in xidmod.FATAL_XIDS


def test_unknown_xid_is_reported_but_not_fatal() -> None:
    info = xidmod.describe(9999)
    assert info.klass == "unknown" and "catalog" in info.meaning
    assert not xidmod.is_fatal(9999)
    assert not xidmod.APPLICATION_XIDS & xidmod.FATAL_XIDS


def test_design_doc_xids_read_as_expected() -> None:
    assert "assert" in xidmod.describe(43).meaning
    assert "page fault" in xidmod.describe(31).meaning
    assert "fallen off the bus" in xidmod.describe(79).meaning


# -- kernel-log parser -----------------------------------------------------------------------

def test_parse_assert_line() -> None:
    x = parse_xid_line(LINE_43)
    assert x is not None
    assert (x.xid, x.pci, x.pid, x.name) == (43, "0000:00:06", 516, "python3")
    assert x.text == "pid=516, name=python3, channel 0x0000000a"
    assert x.line == LINE_43 and x.timestamp is None
    assert x.info.klass == "application"


def test_parse_mmu_fault_line() -> None:
    x = parse_xid_line(LINE_31)
    assert x is not None
    assert (x.xid, x.pid, x.name) == (31, 568, "python3")
    assert "MMU Fault: ENGINE GRAPHICS GPC1" in x.text
    assert x.text.endswith("FAULT_PDE ACCESS_TYPE_VIRT_WRITE")


@pytest.mark.parametrize("prefix, stamp", [
    ("[12345.678901] ", "12345.678901"),
    ("[    5.000001] ", "5.000001"),
    ("2026-11-30T12:00:00,123456+00:00 ", "2026-11-30T12:00:00,123456+00:00"),
    ("2026-11-30T12:00:00,123456+0100 ", "2026-11-30T12:00:00,123456+0100"),
    ("Nov 30 12:00:00 host kernel: ", "Nov 30 12:00:00"),
])
def test_parse_timestamped_lines(prefix: str, stamp: str) -> None:
    x = parse_xid_line(prefix + LINE_43 + "\n")
    assert x is not None
    assert (x.xid, x.pid, x.timestamp) == (43, 516, stamp)
    assert x.line == prefix + LINE_43


def test_parse_lines_without_pid() -> None:
    x = parse_xid_line("[ 99.1] " + LINE_79)
    assert x is not None
    assert (x.xid, x.pci, x.pid, x.name) == (79, "0000:3b:00", None, None)
    assert x.text.endswith("GPU has fallen off the bus.")
    old = parse_xid_line(LINE_13_OLD)
    assert old is not None
    assert (old.xid, old.pci, old.pid, old.name) == (13, "0000:01:00", None, None)
    assert old.text.startswith("Graphics Exception")


@pytest.mark.parametrize("line", [
    "",
    "[    0.000000] Linux version 6.18.44",
    "NVRM: GPU at PCI:0000:00:06: GPU-1234",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
    "NVRM: Xid",
    "some text mentioning Xid 43 in passing",
])
def test_parse_other_lines(line: str) -> None:
    assert parse_xid_line(line) is None


# -- KernelLog -------------------------------------------------------------------------------

class FakeLog:
    """A kernel log the test appends to; ``error`` makes the next reads fail."""

    def __init__(self, lines: list[str] | None = None) -> None:
        self.lines = list(lines or [])
        self.error: Exception | None = None

    def __call__(self) -> list[str]:
        if self.error is not None:
            raise self.error
        return list(self.lines)


def test_kernel_log_reports_only_new_xids() -> None:
    log = FakeLog(["[1.0] boot", "[2.0] " + LINE_31])
    klog = KernelLog(read_lines=log)
    assert klog.start() and klog.available and klog.note == ""
    assert klog.poll() == []
    log.lines += ["[3.0] eth0: link up", "[4.0] " + LINE_43]
    found = klog.poll()
    assert [(x.xid, x.pid, x.timestamp) for x in found] == [(43, 516, "4.0")]
    assert klog.poll() == []
    log.lines += ["[5.0] " + LINE_79, "[6.0] usb 1-1: new device"]
    assert [x.xid for x in klog.poll()] == [79]
    assert [x.xid for x in klog.collected] == [43, 79]


def test_kernel_log_survives_ring_buffer_rotation() -> None:
    log = FakeLog([f"[{i}.0] line {i}" for i in range(10)])
    klog = KernelLog(read_lines=log)
    klog.start()
    # The buffer dropped everything that was there and now holds only new lines.
    log.lines = ["[20.0] " + LINE_43, "[21.0] " + LINE_31]
    assert [x.xid for x in klog.poll()] == [43, 31]


def test_kernel_log_keeps_only_the_last_lines_between_polls() -> None:
    """A crash soak fills the ring buffer with Xid lines: between polls the log keeps only the
    marker of where the last read ended, not the buffer."""
    log = FakeLog([f"[{i}.0] line {i}" for i in range(5000)])
    klog = KernelLog(read_lines=log)
    klog.start()
    log.lines = log.lines[100:] + ["[6000.0] " + LINE_43]
    assert [x.xid for x in klog.poll()] == [43]
    kept = [v for v in vars(klog).values() if isinstance(v, (list, set, dict))]
    assert max(len(v) for v in kept) <= KernelLog._TAIL


def test_kmsg_reader_returns_the_records_logged_since_its_last_call(tmp_path: Path) -> None:
    """/dev/kmsg's records (here a file of them): read from where the log ended at opening,
    stamped like ``dmesg --time-format iso`` so the Xid parser reads them; continuation lines
    skipped."""
    from harness.gpu.kernlog import KmsgReader

    path = tmp_path / "kmsg"
    path.write_text("6,1,1000,-;before the run\n")
    reader = KmsgReader(str(path))
    klog = KernelLog(read_lines=reader)
    assert klog.start() and klog.poll() == []
    with path.open("a") as f:
        f.write("4,2,2000000,-;" + LINE_43 + "\n SUBSYSTEM=pci\n6,3,2500000,-;eth0: link up\n")
    [xid] = klog.poll()
    assert (xid.xid, xid.pid) == (43, 516)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}\+00:00$", xid.timestamp or "")
    assert klog.poll() == []
    klog.close()
    assert klog.poll() == [] and not klog.available and "closed" in klog.note
    with pytest.raises(LogUnavailable, match="cannot read"):
        KmsgReader(str(tmp_path / "missing"))


def test_kernel_log_repeated_identical_lines_are_counted() -> None:
    log = FakeLog(["boot"])
    klog = KernelLog(read_lines=log)
    klog.start()
    log.lines += [LINE_43, LINE_43]
    assert [x.xid for x in klog.poll()] == [43, 43]


def test_kernel_log_unavailable_source() -> None:
    log = FakeLog()
    log.error = LogUnavailable("cannot read the kernel log: Operation not permitted")
    klog = KernelLog(read_lines=log)
    assert klog.start() is False
    assert not klog.available and "Operation not permitted" in klog.note
    assert klog.poll() == []


def test_kernel_log_poll_never_raises_and_recovers() -> None:
    log = FakeLog(["boot"])
    klog = KernelLog(read_lines=log)
    klog.start()
    log.error = RuntimeError("dmesg exploded")
    assert klog.poll() == []
    assert not klog.available and "dmesg exploded" in klog.note
    log.error = None
    log.lines.append(LINE_43)
    assert [x.xid for x in klog.poll()] == [43]
    assert klog.available and klog.note == ""


def test_kernel_log_late_baseline_does_not_report_old_lines() -> None:
    log = FakeLog([LINE_31])
    log.error = LogUnavailable("not yet")
    klog = KernelLog(read_lines=log)
    klog.start()
    log.error = None
    assert klog.poll() == []  # the first good read is the baseline
    log.lines.append(LINE_43)
    assert [x.xid for x in klog.poll()] == [43]


def test_kernel_log_default_reader_never_raises() -> None:
    klog = KernelLog()  # /dev/kmsg or dmesg: may work, be refused, or be missing
    klog.start()
    assert isinstance(klog.poll(), list)
    assert klog.available or klog.note
    klog.close()


def test_dmesg_reader_falls_back_to_plain_dmesg(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if "--time-format" in argv:
            return subprocess.CompletedProcess(argv, 1, "", "dmesg: unrecognized option")
        return subprocess.CompletedProcess(argv, 0, "[1.0] boot\n[2.0] " + LINE_43 + "\n", "")

    monkeypatch.setattr(kernlog.sys, "platform", "linux")
    monkeypatch.setattr(kernlog.subprocess, "run", fake_run)
    reader = DmesgReader()
    assert reader()[-1] == "[2.0] " + LINE_43
    reader()
    assert calls == [["dmesg", "--time-format", "iso"], ["dmesg"], ["dmesg"]]


def test_dmesg_reader_explains_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            argv, 1, "", "dmesg: read kernel buffer failed: Operation not permitted")

    def missing(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(argv[0])

    monkeypatch.setattr(kernlog.sys, "platform", "linux")
    monkeypatch.setattr(kernlog.subprocess, "run", refused)
    klog = KernelLog(read_lines=DmesgReader())  # where /dev/kmsg does not open
    assert not klog.start()
    assert "Operation not permitted" in klog.note and "dmesg_restrict" in klog.note
    monkeypatch.setattr(kernlog.subprocess, "run", missing)
    assert klog.poll() == [] and "not installed" in klog.note
    monkeypatch.setattr(kernlog.sys, "platform", "darwin")
    assert klog.poll() == [] and "only on Linux" in klog.note


# -- a fake pynvml ---------------------------------------------------------------------------

class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801 - pynvml's names
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    pass


class NVMLError_ResetRequired(NVMLError):  # noqa: N801
    value = 16  # what pynvml's class carries


@dataclass(frozen=True)
class Handle:
    index: int


class FakeNvml:
    """The pynvml functions and constants the harness uses; ``fail`` maps a function name to
    the exception it raises."""

    NVMLError = NVMLError
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_NotSupported = NVMLError_NotSupported
    nvmlEventTypeSingleBitEccError = 0x1
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_FEATURE_ENABLED = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1

    def __init__(self, gpus: int = 1, supported: int = 0xB, refuse_combined: bool = False,
                 fail: dict[str, Exception] | None = None) -> None:
        self.handles = [Handle(i) for i in range(gpus)]
        self.supported = supported
        self.refuse_combined = refuse_combined
        self.fail = dict(fail or {})
        self.queue: queue.Queue[Any] = queue.Queue()
        self.registered: list[tuple[int, int]] = []
        self.inits = self.shutdowns = self.freed = 0

    def _check(self, name: str) -> None:
        if name in self.fail:
            raise self.fail[name]

    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._check("nvmlDeviceGetHandleByIndex")
        return self.handles[index]

    def nvmlDeviceGetUUID(self, handle: Handle) -> bytes:
        return f"GPU-{handle.index}".encode()

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        for handle in self.handles:
            if f"GPU-{handle.index}" == uuid:
                return handle
        raise NVMLError("Not Found")

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        return handle.index

    def nvmlDeviceGetName(self, handle: Handle) -> bytes:
        self._check("nvmlDeviceGetName")
        return b"NVIDIA H200"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.95.05"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCudaComputeCapability(self, handle: Handle) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetClockInfo(self, handle: Handle, kind: int) -> int:
        return {1: 1980, 2: 3201}[kind]

    def nvmlDeviceGetMaxClockInfo(self, handle: Handle, kind: int) -> int:
        self._check("nvmlDeviceGetMaxClockInfo")
        return {1: 1980, 2: 3201}[kind]

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        return 41

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetPowerUsage")
        return 123456

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        return 700000

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> Any:
        return SimpleNamespace(total=143771 << 20, used=512 << 20, free=0)

    def nvmlDeviceGetEccMode(self, handle: Handle) -> list[int]:
        self._check("nvmlDeviceGetEccMode")
        return [1, 1]

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, kind: int, counter: int) -> int:
        return 0 if counter == 0 else 2

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        self._check("nvmlDeviceGetRemappedRows")
        return (0, 1, 0, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        return [SimpleNamespace(pid=4242, usedGpuMemory=1 << 30),
                SimpleNamespace(pid=4343, usedGpuMemory=None)]

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        return self.supported

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Handle, mask: int, event_set: str) -> None:
        self._check("nvmlDeviceRegisterEvents")
        if self.refuse_combined and mask != self.nvmlEventTypeXidCriticalError:
            raise NVMLError_NotSupported("Not Supported")
        self.registered.append((handle.index, mask))

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait_v2")
        try:
            return self.queue.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout("Timeout") from None

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed += 1

    def emit(self, index: int, xid: int, event_type: int = 0x8, same_object: bool = True) -> None:
        device = self.handles[index] if same_object else Handle(index)
        self.queue.put(SimpleNamespace(device=device, eventType=event_type, eventData=xid,
                                       gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))


def wait_for(predicate: Any, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# -- NvmlWatcher -----------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _every_gpu_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fakes' GPUs are all visible, whatever the machine running the tests was given."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


class MixedNvml(FakeNvml):
    """Two GPUs of different models: CUDA's default order may not be NVML's."""

    def nvmlDeviceGetName(self, handle: Handle) -> bytes:
        return b"NVIDIA H200" if handle.index == 0 else b"NVIDIA L4"


@pytest.mark.parametrize(("value", "expected"), [
    ("1", [1]), ("1,0", [1, 0]), ("GPU-1", [1]), (" 2 , GPU-0", [2, 0]),
    ("", []), ("0,7,1", [0]), ("1,1,0", [1]), ("-1", []), ("GPU-9", []),
])
def test_cuda_visible_devices_map_to_nvml_as_cuda_reads_them(value: str,
                                                            expected: list[int]) -> None:
    from harness.gpu.nvml import cuda_visible

    assert cuda_visible(FakeNvml(gpus=3), {"CUDA_VISIBLE_DEVICES": value}) == (expected, "")


def test_cuda_visible_says_when_it_cannot_map() -> None:
    from harness.gpu.nvml import cuda_visible

    assert cuda_visible(FakeNvml(gpus=2), {}) == (None, "")
    visible, note = cuda_visible(FakeNvml(gpus=2), {"CUDA_VISIBLE_DEVICES": "MIG-4f1c"})
    assert visible is None and "MIG instance" in note
    visible, note = cuda_visible(MixedNvml(gpus=2), {"CUDA_VISIBLE_DEVICES": "1"})
    assert visible is None and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in note
    ordered = {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert cuda_visible(MixedNvml(gpus=2), ordered) == ([1], "")
    # A UUID names one GPU whatever the order.
    assert cuda_visible(MixedNvml(gpus=2), {"CUDA_VISIBLE_DEVICES": "GPU-1"}) == ([1], "")


def test_visible_gpus_for_doctor(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.gpu.nvml import visible_gpus, visible_uuids

    assert visible_gpus(FakeNvml(gpus=3)) == [0, 1, 2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert visible_gpus(FakeNvml(gpus=3)) == [2, 0]
    assert visible_uuids(FakeNvml(gpus=3)) == ["GPU-2", "GPU-0"]
    broken = FakeNvml(fail={"nvmlInit": NVMLError_LibraryNotFound("no library")})
    assert visible_gpus(broken) == [] and visible_uuids(broken) == []


def test_a_run_on_one_gpu_watches_and_checks_that_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a shared host a run on GPU 1 must not take GPU 0's Xids, health or users for its own."""
    from harness.gpu.nvml import other_gpu_processes

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    fake = FakeNvml(gpus=2)
    watcher = NvmlWatcher(nvml=fake, wait_ms=50)
    assert watcher.start() and watcher.watched == [1]
    fake.emit(1, 43)
    assert wait_for(lambda: len(watcher.events) == 1)
    watcher.stop()
    assert fake.registered == [(1, 0xB)] and watcher.events[0].gpu_index == 1
    snap = health_snapshot(nvml=FakeNvml(gpus=2))
    assert (snap["index"], snap["uuid"], snap["notes"]) == (1, "GPU-1", {})
    assert health_snapshot(nvml=FakeNvml(gpus=2), index=0)["uuid"] == "GPU-0"
    assert other_gpu_processes(nvml=FakeNvml(gpus=2)) == ([4242, 4343], "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    snap = health_snapshot(nvml=FakeNvml(gpus=2))
    assert not snap["available"] and snap["note"] == "CUDA_VISIBLE_DEVICES hides every GPU"
    hidden = NvmlWatcher(nvml=FakeNvml(gpus=2), wait_ms=50)
    assert not hidden.start() and hidden.watched == [] and "no NVIDIA GPU" in hidden.note
    hidden.stop()


def test_watcher_delivers_events_with_gpu_index() -> None:
    fake = FakeNvml(gpus=2)
    seen: list[XidEvent] = []
    watcher = NvmlWatcher(nvml=fake, on_event=seen.append, wait_ms=50)
    assert watcher.start() and watcher.available and watcher.note == ""
    assert watcher.watched == [0, 1]
    fake.emit(1, 43)
    fake.emit(0, 31, same_object=False)  # an equal handle, not the same object
    fake.emit(0, 0, event_type=0x2)
    assert wait_for(lambda: len(watcher.events) == 3)
    watcher.stop()
    first, second, third = watcher.events
    assert (first.xid, first.gpu_index, first.gpu_uuid, first.event_type) == (43, 1, "GPU-1",
                                                                                "xid")
    assert (second.xid, second.gpu_index) == (31, 0)
    assert third.event_type == "ecc-double" and third.fatal
    assert not first.fatal and first.info.klass == "application"
    assert seen == watcher.events
    assert fake.freed == 1 and fake.shutdowns == fake.inits == 1


def test_watcher_stops_promptly() -> None:
    fake = FakeNvml()
    watcher = NvmlWatcher(nvml=fake, wait_ms=500)
    watcher.start()
    t0 = time.monotonic()
    watcher.stop()
    assert time.monotonic() - t0 < 2.0
    assert watcher._thread is not None and not watcher._thread.is_alive()
    watcher.stop()  # twice is fine


def test_watcher_registers_ecc_only_where_supported() -> None:
    fake = FakeNvml(supported=0x8 | 0x4)  # Xid and P-state, no ECC
    with NvmlWatcher(nvml=fake, wait_ms=20) as watcher:
        assert watcher.available
    assert fake.registered == [(0, 0x8)]
    fake = FakeNvml(supported=0xFF)
    with NvmlWatcher(nvml=fake, wait_ms=20):
        pass
    assert fake.registered == [(0, 0x8 | 0x1 | 0x2)]


def test_watcher_falls_back_to_xid_only() -> None:
    fake = FakeNvml(refuse_combined=True)
    with NvmlWatcher(nvml=fake, wait_ms=20) as watcher:
        assert watcher.available
        fake.emit(0, 43)
        assert wait_for(lambda: len(watcher.events) == 1)
    assert fake.registered == [(0, 0x8)]
    assert "Xid events only" in watcher.note


def test_watcher_without_xid_support() -> None:
    fake = FakeNvml(supported=0x3)
    with NvmlWatcher(nvml=fake, wait_ms=20) as watcher:
        assert not watcher.available
    assert "does not support Xid events" in watcher.note
    fake = FakeNvml(fail={"nvmlDeviceRegisterEvents": NVMLError_NotSupported("Not Supported")})
    with NvmlWatcher(nvml=fake, wait_ms=20) as watcher:
        assert not watcher.available
    assert "does not support Xid events" in watcher.note
    assert fake.freed == 1 and fake.shutdowns == 1


def test_watcher_init_failure_is_a_note() -> None:
    fake = FakeNvml(fail={"nvmlInit": NVMLError_LibraryNotFound("NVML Shared Library Not Found")})
    watcher = NvmlWatcher(nvml=fake, wait_ms=20)
    assert watcher.start() is False
    watcher.stop()
    assert watcher.note == "NVML is not available here: NVML Shared Library Not Found"
    assert watcher.events == [] and fake.shutdowns == 0


def test_watcher_survives_a_broken_callback_and_wait_errors() -> None:
    fake = FakeNvml()

    def broken(event: XidEvent) -> None:
        raise ValueError("boom")

    watcher = NvmlWatcher(nvml=fake, on_event=broken, wait_ms=20)
    watcher.start()
    fake.emit(0, 43)
    assert wait_for(lambda: "on_event raised ValueError: boom" in watcher.note)
    fake.fail["nvmlEventSetWait_v2"] = NVMLError("GPU is lost")
    assert wait_for(lambda: "waiting for NVML events failed: GPU is lost" in watcher.note)
    t0 = time.monotonic()
    watcher.stop()
    assert time.monotonic() - t0 < 2.0
    assert [e.xid for e in watcher.events] == [43]
    assert fake.freed == 1 and fake.shutdowns == 1


def test_watcher_events_between() -> None:
    fake = FakeNvml()
    with NvmlWatcher(nvml=fake, wait_ms=20) as watcher:
        fake.emit(0, 13)
        assert wait_for(lambda: len(watcher.events) == 1)
        t_mid = time.time()
        time.sleep(0.01)
        fake.emit(0, 43)
        assert wait_for(lambda: len(watcher.events) == 2)
    assert [e.xid for e in watcher.events_between(0, t_mid)] == [13]
    assert [e.xid for e in watcher.events_between(t_mid, time.time())] == [43]


class OldFakeNvml(FakeNvml):
    """A binding from before nvmlEventSetWait_v2: only nvmlEventSetWait."""

    nvmlEventSetWait_v2 = None  # type: ignore[assignment]

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        return FakeNvml.nvmlEventSetWait_v2(self, event_set, timeout_ms)


def test_watcher_with_an_older_binding() -> None:
    fake = OldFakeNvml()
    with NvmlWatcher(nvml=fake, wait_ms=20) as watcher:
        fake.emit(0, 43)
        assert wait_for(lambda: len(watcher.events) == 1)
    assert watcher.events[0].xid == 43


def test_watcher_with_real_pynvml_without_gpu() -> None:
    watcher = NvmlWatcher(wait_ms=20)
    available = watcher.start()
    watcher.stop()
    if available:
        pytest.skip("NVML initialized here: this machine has a GPU")
    assert watcher.note.startswith("NVML is not available here")


def test_device_handles_compare_by_address() -> None:
    # pynvml handles are ctypes pointers; two pointer objects to one device are not ==.
    target = ctypes.c_int(7)
    a = ctypes.pointer(target)
    b = ctypes.cast(ctypes.addressof(target), ctypes.POINTER(ctypes.c_int))
    assert a is not b
    assert _same_device(a, b)
    assert not _same_device(a, ctypes.pointer(ctypes.c_int(7)))


# -- health_snapshot and nvml_summary --------------------------------------------------------

def test_health_snapshot_with_unsupported_fields() -> None:
    fake = FakeNvml(fail={
        "nvmlDeviceGetEccMode": NVMLError_NotSupported("Not Supported"),
        "nvmlDeviceGetRemappedRows": NVMLError_NotSupported("Not Supported"),
        "nvmlDeviceGetPowerUsage": NVMLError("Unknown Error"),
        "nvmlDeviceGetMaxClockInfo": NVMLError_NotSupported("Not Supported"),
    })
    snap = health_snapshot(nvml=fake)
    assert snap["available"] and snap["note"] == ""
    assert snap["name"] == "NVIDIA H200" and snap["uuid"] == "GPU-0"
    assert snap["driver_version"] == "580.95.05"
    assert snap["cuda_driver_version"] == "13.0" and snap["compute_capability"] == "9.0"
    assert snap["clocks_mhz"] == {"sm": 1980, "mem": 3201}
    assert snap["max_clocks_mhz"] == {"sm": None, "mem": None}
    assert snap["temperature_c"] == 41 and snap["power_limit_w"] == 700.0
    assert snap["memory"] == {"total_mib": 143771, "used_mib": 512}
    assert snap["processes"] == [{"pid": 4242, "used_mib": 1024}, {"pid": 4343, "used_mib": None}]
    assert snap["ecc"] is None and snap["remapped_rows"] is None and snap["power_w"] is None
    assert set(snap["notes"]) == {"ecc", "remapped_rows", "power_w", "max_clocks_mhz.sm",
                                  "max_clocks_mhz.mem"}
    assert snap["notes"]["ecc"] == "Not Supported"
    assert "T" in snap["time"]
    assert fake.shutdowns == fake.inits == 1


def test_health_snapshot_all_fields() -> None:
    snap = health_snapshot(nvml=FakeNvml())
    assert snap["notes"] == {}
    assert snap["power_w"] == 123.5
    assert snap["ecc"] == {"mode": "enabled", "volatile_uncorrected": 0,
                           "aggregate_uncorrected": 2}
    assert snap["remapped_rows"] == {"correctable": 0, "uncorrectable": 1, "pending": False,
                                     "failure": False}


def test_health_snapshot_without_nvml_or_gpu() -> None:
    fake = FakeNvml(fail={"nvmlInit": NVMLError_LibraryNotFound("NVML Shared Library Not Found")})
    snap = health_snapshot(nvml=fake)
    assert not snap["available"] and "Library Not Found" in snap["note"]
    assert snap["name"] is None and snap["processes"] is None
    fake = FakeNvml(fail={"nvmlDeviceGetHandleByIndex": NVMLError("Invalid Argument")})
    snap = health_snapshot(nvml=fake, index=3)
    assert not snap["available"] and snap["note"] == "NVML has no GPU 3: Invalid Argument"
    assert fake.shutdowns == 1


def test_health_snapshot_by_uuid_and_a_gpu_that_needs_a_reset() -> None:
    """A GPU the driver will not run until it is reset: every query answers "GPU requires
    restart" (seen on an H200 whose GSP stopped answering), or NVML names a recovery action."""
    snap = health_snapshot(nvml=FakeNvml(gpus=3), index="GPU-2")
    assert snap["available"] and snap["index"] == 2 and snap["uuid"] == "GPU-2"
    assert snap["needs_reset"] == ""  # an older binding: no recovery-action field to read
    assert not health_snapshot(nvml=FakeNvml(), index="GPU-7")["available"]
    wedged = FakeNvml(fail={
        "nvmlDeviceGetRemappedRows": NVMLError_ResetRequired("GPU requires restart"),
        "nvmlDeviceGetPowerUsage": NVMLError_NotSupported("Not Supported")})
    snap = health_snapshot(nvml=wedged)
    assert snap["available"] and "requires a reset" in snap["needs_reset"]
    assert "remapped_rows: GPU requires restart" in snap["needs_reset"]

    class Recovering(FakeNvml):
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 271
        NVML_GPU_RECOVERY_ACTION_NONE = 0
        NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1
        action = 1

        def nvmlDeviceGetFieldValues(self, handle: Handle, ids: list[int]) -> list[Any]:
            assert ids == [271]
            return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=self.action))]

    assert health_snapshot(nvml=Recovering())["needs_reset"] == \
        "NVML's recovery action for the GPU is 'gpu reset'"
    Recovering.action = 0
    assert health_snapshot(nvml=Recovering())["needs_reset"] == ""


def test_health_snapshot_with_real_pynvml() -> None:
    snap = health_snapshot()
    if snap["available"]:
        pytest.skip("NVML initialized here: this machine has a GPU")
    assert snap["note"].startswith("NVML is not available here")


def test_nvml_summary() -> None:
    out = nvml_summary(nvml=FakeNvml(gpus=2))
    assert out["available"] and out["note"] == ""
    assert out["driver_version"] == "580.95.05" and out["device_count"] == 2
    assert out["devices"] == [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-0"},
                              {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-1"}]
    assert out["xid_events"] == "supported"
    assert nvml_summary(nvml=FakeNvml(supported=0x3))["xid_events"] == "not supported"
    refused = FakeNvml(fail={"nvmlDeviceRegisterEvents": NVMLError("Insufficient Permissions")})
    assert nvml_summary(nvml=refused)["xid_events"] == "GPU 0: Insufficient Permissions"
    named = nvml_summary(nvml=FakeNvml(fail={"nvmlDeviceGetName": NVMLError("Unknown Error")}))
    assert named["devices"][0]["name"] is None and "Unknown Error" in named["note"]


def test_nvml_summary_with_real_pynvml() -> None:
    out = nvml_summary()
    if out["available"]:
        pytest.skip("NVML initialized here: this machine has a GPU")
    assert out["note"].startswith("NVML is not available here")
    assert out["xid_events"] == out["note"] and out["devices"] == []


def test_other_gpu_processes_lists_others_and_says_why_not() -> None:
    from harness.gpu.nvml import other_gpu_processes

    assert other_gpu_processes(nvml=FakeNvml()) == ([4242, 4343], "")
    # Asked from a probe child on behalf of process 4242: the asker is not "another" user.
    assert other_gpu_processes(nvml=FakeNvml(), me=4242) == ([4343], "")
    none = FakeNvml(fail={"nvmlInit": NVMLError_LibraryNotFound("NVML Shared Library Not Found")})
    pids, note = other_gpu_processes(nvml=none)
    assert pids == [] and "Library Not Found" in note


# -- the watcher's helper process -------------------------------------------------------------

def test_helper_protocol_sends_events_answers_health_and_stops() -> None:
    """The helper's loop, in a thread with a fake NVML: ready, each event, a health answer,
    and a clean stop that releases NVML."""
    import multiprocessing
    import threading

    from harness.gpu.watchproc import serve

    fake = FakeNvml()
    parent, child = multiprocessing.Pipe(duplex=True)
    helper = threading.Thread(target=serve, args=(
        child, lambda on_event: NvmlWatcher(nvml=fake, on_event=on_event, wait_ms=20),
        lambda index: {"index": index, "available": True}))
    helper.start()
    ready = parent.recv()
    assert ready == ("ready", True, [0], "")
    fake.emit(0, 43)
    kind, event = parent.recv()
    assert kind == "event" and (event.xid, event.gpu_index, event.gpu_uuid) == (43, 0, "GPU-0")
    parent.send(("health", 0))
    assert parent.recv() == ("health", {"index": 0, "available": True})
    parent.send(("stop",))
    assert parent.recv() == ("stopped", "")
    helper.join(5)
    assert not helper.is_alive() and fake.shutdowns == fake.inits == 1


def test_helper_ends_when_the_parent_end_closes() -> None:
    import multiprocessing
    import threading

    from harness.gpu.watchproc import serve

    fake = FakeNvml()
    parent, child = multiprocessing.Pipe(duplex=True)
    helper = threading.Thread(target=serve, args=(
        child, lambda on_event: NvmlWatcher(nvml=fake, on_event=on_event, wait_ms=20)))
    helper.start()
    assert parent.recv()[0] == "ready"
    parent.close()
    helper.join(5)
    assert not helper.is_alive() and fake.shutdowns == 1


def test_watcher_process_without_a_gpu_says_why_and_leaves_nothing() -> None:
    """The real helper process, with the real pynvml, on a machine without NVML."""
    from harness.gpu.watchproc import WatcherProcess

    watcher = WatcherProcess(wait_ms=20)
    if watcher.start():
        watcher.stop()
        pytest.skip("NVML initialized here: this machine has a GPU")
    assert watcher.note.startswith("NVML is not available here")
    assert watcher.events_since(0.0) == [] and watcher.watched == []
    snap = watcher.health()  # answered by the helper, which is still running
    assert snap["available"] is False and snap["note"].startswith("NVML is not available here")
    proc = watcher._proc
    assert proc is not None and proc.is_alive()
    watcher.stop()
    assert not proc.is_alive() and watcher._proc is None
    watcher.stop()  # twice is fine


def test_watcher_process_that_dies_is_a_note_not_an_error() -> None:
    from harness.gpu.watchproc import WatcherProcess

    watcher = WatcherProcess(wait_ms=20)
    watcher.start()
    proc = watcher._proc
    assert proc is not None
    proc.kill()
    proc.join(5)
    # Found dead as its events are read: said, and started again once.
    assert re.search(r"the NVML watcher process died \(exit code -9\) at [0-9:]{8}; a new one "
                     r"watches since [0-9:]{8} \(NVML events between were not seen\)",
                     watcher.note), watcher.note
    assert len(watcher.gaps) == 1 and watcher._proc is not None and watcher._proc.is_alive()
    again = watcher._proc
    again.kill()
    again.join(5)
    assert "again: Xid watching is off for the rest of the run" in watcher.note
    assert len(watcher.gaps) == 2 and watcher._proc is None
    assert not watcher.available and watcher.events == []
    assert watcher.health()["available"] in (True, False)  # taken here, without the helper
    watcher.stop()


# -- the CUDA probe ---------------------------------------------------------------------------

def test_probe_without_cupy_answers_here_and_says_what_to_install() -> None:
    from harness.gpu.probe import cuda_state, cuda_usable

    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("CuPy is installed here")
    cuda_state.cache_clear()
    ok, why = cuda_usable()
    assert not ok and "CuPy is not importable" in why and "gpurace[cuda]" in why


def test_probe_asks_in_a_child_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where CuPy can be found, the parent never imports it: a child answers. Here CuPy is made
    findable for the parent only, so the child's import fails and says so."""
    import importlib.util

    import kvcore.device.cuda
    from harness.gpu import probe

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "cupy" else real(name, *a))
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("CuPy is installed here")
    # Answered here, the probe would say this instead:
    monkeypatch.setattr(kvcore.device.cuda, "available", lambda: (False, "asked in the parent"))
    probe.cuda_state.cache_clear()
    ok, why = probe.cuda_usable()
    probe.cuda_state.cache_clear()  # what was asked with cupy made findable is no answer here
    assert not ok and "CuPy is not importable" in why


def test_a_question_that_fails_or_cannot_travel_is_a_reason() -> None:
    from harness.gpu.probe import ask

    assert ask(int, "12", what="the test") == (12, "")
    assert ask(int, "x", what="the test") == (
        None, "the test failed: ValueError: invalid literal for int() with base 10: 'x'")
    answer, why = ask(lambda: 1, what="the test")
    assert answer is None and why.startswith("the test could not start a process")


def test_an_event_before_ready_is_kept() -> None:
    """The watcher thread can send an Xid before the helper says it is ready."""
    import multiprocessing

    from harness.gpu.watchproc import WatcherProcess

    parent, child = multiprocessing.Pipe(duplex=True)
    event = XidEvent(43, 0, "GPU-0", "xid", time.time(), time.monotonic())
    child.send(("event", event))
    child.send(("ready", True, [0], ""))
    watcher = WatcherProcess()
    assert watcher._await_ready(parent, 1.0) == ("ready", True, [0], "")
    assert watcher._events == [event]
    assert watcher._await_ready(parent, 0.05) is None  # nothing more: not ready in time


def test_the_busy_check_looks_at_the_gpu_each_lane_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import harness.gpu.nvml as nvml
    from harness.gpu.probe import _users_seen_as, other_gpu_users

    seen = []

    def users(index: object, mod: object, me: int) -> tuple[list[int], str]:
        seen.append((index, os.environ["CUDA_VISIBLE_DEVICES"], me))
        return [7], ""

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # restored after the test
    monkeypatch.setattr(nvml, "other_gpu_processes", users)
    assert _users_seen_as("1", 42) == ([7], "")
    assert seen == [(None, "1", 42)]  # the lane's GPU is the first its worker sees
    # In a real child: an answer (here, without NVML, an empty list and why), not a failure.
    pids, note = other_gpu_users("1")
    assert isinstance(pids, list) and not note.startswith("the GPU process check"), note


# -- the helper watched: restarted once, then given up, never a silent gap (#34) -----------

def _watch_until(watcher, gaps: int, within_s: float = 10.0) -> None:
    """Read the helper's events (which is when it is looked after) until ``gaps`` gaps."""
    deadline = time.monotonic() + within_s
    while len(watcher.gaps) < gaps and time.monotonic() < deadline:
        watcher.events  # noqa: B018 (reading is what drives the watchdog)
        time.sleep(0.05)


def test_a_helper_that_dies_once_is_started_again_and_the_gap_said(tmp_path, monkeypatch):
    import nvml_helpers
    from harness.gpu.watchproc import WatcherProcess

    monkeypatch.setenv(nvml_helpers.MARKER, str(tmp_path / "ran"))
    said = []
    watcher = WatcherProcess(wait_ms=20, target=nvml_helpers.dies_once, on_gap=said.append,
                             ping_every_s=0.1, hung_after_s=2.0)
    assert watcher.start() is True
    _watch_until(watcher, 1)
    assert said == watcher.gaps and len(said) == 1
    assert re.fullmatch(r"the NVML watcher process died \(exit code 3\) at [0-9:]{8}; a new "
                        r"one watches since [0-9:]{8} \(NVML events between were not seen\)",
                        said[0]), said
    assert watcher.available  # watching again
    time.sleep(0.5)
    watcher.events  # noqa: B018
    assert len(watcher.gaps) == 1  # the new one answers its pings: no second gap
    watcher.stop()


def test_a_helper_that_hangs_twice_leaves_xid_watching_off_and_says_so(monkeypatch):
    import nvml_helpers
    from harness.gpu.watchproc import WatcherProcess

    watcher = WatcherProcess(wait_ms=20, target=nvml_helpers.hangs, ping_every_s=0.1,
                             hung_after_s=0.5)
    assert watcher.start() is True
    first = watcher._proc
    _watch_until(watcher, 2)
    assert len(watcher.gaps) == 2 and all(
        re.match(r"the NVML watcher process did not answer for \d+ s at ", g)
        for g in watcher.gaps), watcher.gaps
    assert "a new one watches since" in watcher.gaps[0]
    assert watcher.gaps[1].endswith("again: Xid watching is off for the rest of the run "
                                    "(NVML events after this are not seen)")
    assert not watcher.available and watcher._proc is None
    assert first is not None and not first.is_alive()  # the hung helpers were put down
    watcher.stop()


def test_a_helper_stuck_in_nvmls_event_wait_is_taken_for_hung():
    import nvml_helpers
    from harness.gpu.watchproc import WatcherProcess

    watcher = WatcherProcess(wait_ms=20, target=nvml_helpers.stuck_wait, ping_every_s=0.1,
                             hung_after_s=5.0)
    watcher.start()
    _watch_until(watcher, 1)
    assert watcher.gaps[0].startswith(
        "the NVML watcher process was stuck in NVML's event wait for 600 s at ")
    watcher.stop()


def test_a_kernel_log_that_stops_reading_mid_run_is_a_gap_said_both_ways():
    from harness.gpu.kernlog import KernelLog, LogUnavailable
    from harness.gpu.watch import GpuWatch

    state = {"readable": True}

    def read_lines():
        if not state["readable"]:
            raise LogUnavailable("/dev/kmsg: Permission denied")
        return ["[1.0] boot"]

    said = []
    gpu = GpuWatch("sim", on_gap=said.append)
    gpu.backend, gpu.klog = "cuda", KernelLog(read_lines)  # no NVML helper: only the log
    assert gpu.klog.start()
    gpu._klog_read = True
    gpu.fatal_since(0.0)
    assert said == []
    state["readable"] = False
    gpu.fatal_since(0.0)
    gpu.fatal_since(0.0)  # said once while it stays unreadable
    state["readable"] = True
    gpu.fatal_since(0.0)
    assert len(said) == 2 and said == gpu.gaps
    assert re.fullmatch(r"the kernel log could not be read at [0-9:]{8} \(/dev/kmsg: Permission "
                        r"denied\): its Xid lines are not seen until it reads again", said[0])
    assert re.fullmatch(r"the kernel log reads again since [0-9:]{8}", said[1])
