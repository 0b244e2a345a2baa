"""What a device hands out: buffers (device or pinned host memory), streams and events.

Plain handles, with no behaviour of their own: the :class:`~kvcore.device.base.Device` that
made each one checks and uses it, and the kernels of :mod:`kvcore.device.kernels` name the
buffers they touch. Both import them from here, so neither imports the other.
"""

from __future__ import annotations

from kvcore.device.oplog import BufferInfo

DEVICE = "device"
PINNED = "host"


class Buffer:
    """A device allocation or a pinned host allocation, as the op log and backends know it."""

    __slots__ = ("id", "name", "space", "nbytes", "role", "handle", "address", "owner",
                 "__weakref__")

    def __init__(self, id: int, name: str, space: str, nbytes: int, role: str, handle: object):
        self.id = id
        self.name = name
        self.space = space
        self.nbytes = nbytes
        self.role = role
        self.handle = handle
        # The CUDA address (device pointer, or the pinned host pointer, which kernels can use
        # through unified addressing); 0 on the simulated device.
        self.address = int(getattr(handle, "ptr", 0) or 0)
        # The device that allocated it (set by the device): checked on every op, so a plain
        # identity test rather than a lookup.
        self.owner: object = None

    def info(self) -> BufferInfo:
        return BufferInfo(self.id, self.name, self.space, self.nbytes, self.role)

    def __repr__(self) -> str:
        return f"Buffer({self.name!r}, {self.space}, {self.nbytes} B)"


class Stream:
    """A CUDA stream. ``blocking`` streams synchronize implicitly with the legacy stream;
    non-blocking ones (what engines use) do not. ``priority`` follows CUDA (lower numbers run
    first when both have work ready); it changes no ordering guarantee."""

    __slots__ = ("id", "name", "blocking", "legacy", "handle", "priority", "owner")

    def __init__(self, id: int, name: str, blocking: bool, legacy: bool, handle: object,
                 priority: int = 0):
        self.id = id
        self.name = name
        self.blocking = blocking
        self.legacy = legacy
        self.handle = handle
        self.priority = priority
        self.owner: object = None  # the device it was registered with

    def __repr__(self) -> str:
        flavour = "legacy" if self.legacy else ("blocking" if self.blocking else "non-blocking")
        return f"Stream({self.name!r}, {flavour})"


class Event:
    """A CUDA event: recorded on one stream, waited on by another stream or the host."""

    __slots__ = ("id", "name", "handle")

    def __init__(self, id: int, name: str, handle: object):
        self.id = id
        self.name = name
        self.handle = handle

    def __repr__(self) -> str:
        return f"Event({self.name!r})"
