"""The Device interface's CUDA semantics, on sim (and on cuda where the outcome is
deterministic, which a long delay makes it)."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import kvcore
from conftest import make_device
from kvcore.device.kernels import Delay, Fill, Verify
from kvcore.device.oplog import OpRecorder
from programs import read_int32

MIB = 1 << 20


def _landing_order(device: kvcore.Device, second: kvcore.device.Stream) -> int:
    """Fill a buffer with 1 on the legacy stream behind a 2 ms delay, then with 2 on
    ``second``: returns the value that landed last."""
    buf = device.alloc(4096, name="buf")
    device.launch(Delay(2000.0), device.legacy_stream)
    device.launch(Fill(buf, 0, 4096, 1), device.legacy_stream)
    device.launch(Fill(buf, 0, 4096, 2), second)
    device.synchronize()
    host = device.alloc_host(4096, name="out")
    device.copy(host, 0, buf, 0, 4096, second)
    device.synchronize()
    values = set(device.host_read(host, 0, 4096).tolist())
    assert len(values) == 1
    return values.pop()


def test_legacy_stream_orders_blocking_stream(backend: str, request) -> None:
    device = make_device(backend, request)
    assert _landing_order(device, device.create_stream("blocking", blocking=True)) == 2


def test_legacy_stream_does_not_order_non_blocking_stream(backend: str, request) -> None:
    device = make_device(backend, request)
    assert _landing_order(device, device.create_stream("nonblocking")) == 1


def test_event_wait_orders_streams(backend: str, request) -> None:
    device = make_device(backend, request)
    a, b = device.create_stream("a"), device.create_stream("b")
    buf = device.alloc(4096, name="buf")
    device.launch(Delay(2000.0), a)
    device.launch(Fill(buf, 0, 4096, 1), a)
    event = device.create_event("e")
    device.record_event(event, a)
    device.wait_event(b, event)
    device.launch(Fill(buf, 0, 4096, 2), b)
    result = device.alloc(4, name="result")
    device.memset(result, 0, 4, 0, b)
    device.launch(Verify(buf, 0, 4096, 2, result), b)
    assert read_int32(device, result, b) == 0


def test_pinned_copy_reads_host_memory_when_it_runs(backend: str, request) -> None:
    """A host write between issuing an async copy from pinned memory and the copy running is
    what the copy moves: the host buffer is read late."""
    device = make_device(backend, request)
    s = device.create_stream("s")
    host = device.alloc_host(4096, name="host")
    buf = device.alloc(4096, name="buf")
    device.host_fill(host, 0, 4096, 0xAA)
    device.launch(Delay(2000.0), s)
    device.copy(buf, 0, host, 0, 4096, s)
    device.host_fill(host, 0, 4096, 0xBB)
    result = device.alloc(4, name="result")
    device.memset(result, 0, 4, 0, s)
    device.launch(Verify(buf, 0, 4096, 0xBB, result), s)
    assert read_int32(device, result, s) == 0


def test_reader_racing_a_chunked_copy_sees_it_torn() -> None:
    device = kvcore.open_device("sim")
    a, b = device.create_stream("a"), device.create_stream("b")
    host = device.alloc_host(64 * MIB, name="host")
    buf = device.alloc(64 * MIB, name="buf")
    device.host_fill(host, 0, 64 * MIB, 7)
    result = device.alloc(4, name="result")
    device.memset(result, 0, 4, 0, b)
    device.synchronize()
    device.copy(buf, 0, host, 0, 64 * MIB, a)       # ~1.2 ms of DMA
    device.launch(Delay(600.0), b)
    device.launch(Verify(buf, 0, 64 * MIB, 7, result), b)
    bad = read_int32(device, result, b)
    assert 0 < bad < 64 * MIB


def test_same_seed_same_op_log_and_timing() -> None:
    def trace(seed: int) -> list[dict[str, object]]:
        from seed_port import page_release_race

        device = kvcore.open_device("sim", defects=kvcore.Defects(release_fence=False),
                                    seed=seed)
        recorder = OpRecorder(device.oplog)
        page_release_race(kvcore.DeviceContext(device), 200.0)
        return [r.to_json() for r in recorder.records]

    assert trace(5) == trace(5)
    assert trace(5) != trace(6)  # the jitter moves device times


def test_hung_kernel_hangs_the_host_that_waits() -> None:
    device = kvcore.open_device("sim")
    s = device.create_stream("s")
    device.launch(Delay(None), s)
    waiter = threading.Thread(target=device.synchronize, daemon=True)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()


def test_usage_errors_are_clear(backend: str, request) -> None:
    device = make_device(backend, request)
    s = device.create_stream("s")
    buf = device.alloc(1024, name="buf")
    host = device.alloc_host(1024, name="host")
    with pytest.raises(kvcore.DeviceUsageError, match=r"\[1000, 1100\) are outside buf"):
        device.copy(buf, 1000, host, 0, 100, s)
    with pytest.raises(kvcore.DeviceUsageError, match="device memory; copy it first"):
        device.host_fill(buf, 0, 4, 1)
    with pytest.raises(kvcore.DeviceUsageError, match="pinned host memory"):
        device.memset(host, 0, 4, 0, s)
    other = kvcore.open_device("sim")
    with pytest.raises(kvcore.DeviceUsageError, match="does not belong"):
        device.memset(buf, 0, 4, 0, other.create_stream("x"))
    with pytest.raises(kvcore.DeviceUsageError, match="not allocated on this device"):
        device.memset(other.alloc(16, name="foreign"), 0, 4, 0, s)


def test_op_log_records_only_while_observed(monkeypatch: pytest.MonkeyPatch) -> None:
    device = kvcore.open_device("sim")
    built = []
    monkeypatch.setattr(kvcore.device.base.OpRecord, "__init__",
                        lambda self, *a, **k: built.append(1) or None, raising=False)
    s = device.create_stream("s")
    buf = device.alloc(64, name="buf")
    device.memset(buf, 0, 64, 0, s)
    assert built == []


def test_op_records_carry_ranges_steps_and_times() -> None:
    device = kvcore.open_device("sim")
    s = device.create_stream("s")
    buf = device.alloc(4096, name="buf")
    host = device.alloc_host(4096, name="host")
    recorder = OpRecorder(device.oplog)
    with device.oplog.in_step("write-old"):
        device.copy(buf, 1024, host, 0, 512, s)
    record = recorder.records[-1]
    assert record.kind == "copy_htod" and record.stream == "s" and record.step == "write-old"
    assert record.reads[0] == kvcore.device.Access(host.id, 0, 512)
    assert record.writes[0] == kvcore.device.Access(buf.id, 1024, 512)
    assert record.t_start_ns is not None and record.t_end_ns > record.t_start_ns
    assert recorder.buffers[buf.id].name == "buf"


def test_open_device_choices() -> None:
    with pytest.raises(kvcore.DeviceUnavailableError, match="unknown backend"):
        kvcore.open_device("tpu")
    device = kvcore.open_device("auto")
    assert device.kind == ("cuda" if kvcore.cuda_available()[0] else "sim")


def test_cuda_without_gpu_says_what_to_install() -> None:
    if kvcore.cuda_available()[0]:
        pytest.skip("a GPU is usable here")
    with pytest.raises(kvcore.DeviceUnavailableError, match="cannot run here"):
        kvcore.open_device("cuda")


def test_import_kvcore_does_not_import_cupy() -> None:
    code = "import sys, kvcore; kvcore.open_device('sim'); print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_host_write_accepts_arrays_and_bytes() -> None:
    device = kvcore.open_device("sim")
    host = device.alloc_host(16, name="h")
    device.host_write(host, 0, b"\x01\x02")
    device.host_write(host, 4, np.array([7], np.int32))
    assert device.host_read(host, 0, 8).tolist() == [1, 2, 0, 0, 7, 0, 0, 0]


def test_event_query_sees_not_ready_then_done(backend: str, request) -> None:
    """cudaEventQuery: "not ready" while a delay holds the stream, "done" once it passed;
    a never-recorded event is done. Neither query blocks."""
    device = make_device(backend, request)
    s = device.create_stream("query")
    event = device.create_event("behind-delay")
    assert device.query_event(device.create_event("never-recorded")) is True
    device.launch(Delay(5000.0), s)
    device.record_event(event, s)
    assert device.query_event(event) is False
    polls = device.poll_event(event)
    assert polls > 1 and device.query_event(event) is True


def test_a_stream_with_a_priority_runs_and_orders_as_any_other(backend: str,
                                                               request) -> None:
    device = make_device(backend, request)
    high = device.create_stream("high", priority=-5)
    low = device.create_stream("low", priority=0)
    assert (high.priority, low.priority) == (-5, 0)
    assert device.oplog.streams["high"].priority == -5
    buf = device.alloc(4096, name="buf")
    device.launch(Delay(2000.0), low)
    device.launch(Fill(buf, 0, 4096, 1), low)
    event = device.create_event("low-done")
    device.record_event(event, low)
    device.wait_event(high, event)
    device.launch(Fill(buf, 0, 4096, 2), high)
    result = device.alloc(4, name="result")
    device.memset(result, 0, 4, 0, high)
    device.launch(Verify(buf, 0, 4096, 2, result), high)
    device.synchronize()
    assert read_int32(device, result, high) == 0  # the high-priority fill still landed second


def test_rename_the_legacy_stream_for_findings() -> None:
    device = kvcore.open_device("sim")
    device.rename_stream(device.legacy_stream, "default")
    assert device.legacy_stream.name == "default"
    assert "default" in device.oplog.streams and "legacy_stream" not in device.oplog.streams
    device.create_stream("user")
    with pytest.raises(kvcore.DeviceUsageError, match="a stream named 'user' exists already"):
        device.rename_stream(device.legacy_stream, "user")


def test_a_cuda_device_names_its_gpu_as_nvml_does() -> None:
    """A GPU's UUID and PCI address, from CUDA's device properties, in NVML's and the kernel
    log's spelling: how a run on several GPUs tells their Xids apart."""
    from kvcore.device.cuda import _pci_bus_id, _uuid

    raw = bytes.fromhex("c74544341b63622186becfa0953be945")
    assert _uuid(raw) == "GPU-c7454434-1b63-6221-86be-cfa0953be945"
    assert _uuid(b"short") is None and _uuid(None) is None
    assert _pci_bus_id({"pciDomainID": 0, "pciBusID": 0x3B, "pciDeviceID": 0}) == "0000:3b:00"
    assert _pci_bus_id({}) is None
