"""The Device interface and its backends: ``cuda`` (CuPy, imported lazily) and ``sim``."""

from __future__ import annotations

from kvcore.defects import Defects
from kvcore.device.base import Device, DeviceInfo
from kvcore.device.graph import Graph
from kvcore.device.handles import Buffer, Event, Stream
from kvcore.device.oplog import HOST, Access, BufferInfo, OpLog, OpRecord, OpRecorder
from kvcore.device.schedule import Schedule
from kvcore.errors import DeviceUnavailableError, DeviceUsageError

BACKENDS = ("auto", "cuda", "sim")


def cuda_available() -> tuple[bool, str]:
    """Whether the cuda backend can run here, and why not; never raises."""
    from kvcore.device import cuda

    return cuda.available()


def open_device(kind: str = "auto", *, defects: Defects = Defects(), seed: int = 0,
                index: int = 0, schedule: Schedule | None = None,
                timeline: bool = False) -> Device:
    """Open a device: ``cuda`` (raises DeviceUnavailableError without a GPU), ``sim``, or
    ``auto`` (cuda when a GPU is usable, else sim). A ``schedule`` (sim only) holds back the
    device ops it names, to force one ordering of the unordered ones. ``timeline`` (cuda)
    times every stream op with CUDA events (``Device.settle_times``); the simulated device
    knows its ops' times anyway."""
    if kind not in BACKENDS:
        raise DeviceUnavailableError(f"unknown backend {kind!r}; use one of {', '.join(BACKENDS)}")
    if kind == "auto":
        kind = "cuda" if cuda_available()[0] else "sim"
    if kind == "sim":
        from kvcore.device.sim import SimDevice

        return SimDevice(defects=defects, seed=seed, schedule=schedule)
    if schedule is not None:
        raise DeviceUsageError("a schedule replays on the simulated device only (--backend sim)")
    ok, why = cuda_available()
    if not ok:
        raise DeviceUnavailableError(f"the cuda backend cannot run here: {why}")
    from kvcore.device.cuda import CudaDevice

    return CudaDevice(defects=defects, seed=seed, index=index, timeline=timeline)


__all__ = [
    "BACKENDS", "HOST", "Access", "Buffer", "BufferInfo", "Device", "DeviceInfo", "Event",
    "Graph", "OpLog", "OpRecord", "OpRecorder", "Schedule", "Stream", "cuda_available",
    "open_device",
]
