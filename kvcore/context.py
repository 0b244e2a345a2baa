"""DeviceContext and DeviceArena: the streams and the memory the pool lives in."""

from __future__ import annotations

from kvcore.device.base import Device
from kvcore.device.handles import Buffer, Stream


class DeviceContext:
    """The streams of one engine on one device, as ninfer's DeviceContext has them.

    ``stream`` (compute) and ``transfer_stream`` are both non-blocking, as engines create
    theirs; ``legacy_stream`` is the legacy default stream (stream 0), which they do not wait
    for. That asymmetry is ninfer #210. An engine that made its streams already passes them.
    """

    def __init__(self, device: Device, *, stream: Stream | None = None,
                 transfer_stream: Stream | None = None) -> None:
        self.device = device
        self.stream: Stream = stream or device.create_stream("stream")
        self.transfer_stream: Stream = transfer_stream or device.create_stream("transfer_stream")
        self.legacy_stream: Stream = device.legacy_stream

    def synchronize(self) -> None:
        """Wait on the host until every stream of the device is idle."""
        self.device.synchronize()


class DeviceArena:
    """One device allocation that a page pool carves into pages."""

    def __init__(self, context: DeviceContext, capacity: int, *, name: str = "kv-arena") -> None:
        self.context = context
        self.buffer: Buffer = context.device.alloc(capacity, name=name)

    @property
    def capacity(self) -> int:
        return self.buffer.nbytes
