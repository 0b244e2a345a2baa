"""Page geometry: how many bytes a KV page holds, plane by plane, on the device and the host."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property

from kvcore.errors import GeometryError


class DType(enum.Enum):
    """Element types of a KV plane, with their size in bytes."""

    I8 = ("i8", 1)
    FP8 = ("fp8", 1)
    F16 = ("f16", 2)
    BF16 = ("bf16", 2)
    F32 = ("f32", 4)

    def __init__(self, label: str, size: int) -> None:
        self.label = label
        self.size = size

    @classmethod
    def parse(cls, text: str) -> DType:
        for member in cls:
            if member.label == text.lower():
                return member
        raise GeometryError(
            f"unknown dtype {text!r}; use one of {', '.join(m.label for m in cls)}"
        )


def align_up(value: int, align: int) -> int:
    return -(-value // align) * align


@dataclass(frozen=True)
class KVPlaneGeometry:
    """One plane of a page (keys, values, scales...): ``page_tokens x leading x heads`` elements
    of ``dtype``, its start aligned to ``align`` bytes within the page."""

    dtype: DType
    leading: int
    heads: int
    align: int = 256

    def __post_init__(self) -> None:
        if self.leading <= 0 or self.heads <= 0:
            raise GeometryError(f"plane leading ({self.leading}) and heads ({self.heads}) "
                                "must be positive")
        if self.align <= 0 or self.align & (self.align - 1):
            raise GeometryError(f"plane align must be a power of two, not {self.align}")

    def payload_bytes(self, page_tokens: int) -> int:
        return page_tokens * self.leading * self.heads * self.dtype.size


@dataclass(frozen=True)
class KVPageGeometry:
    """A page: its planes one after another, each aligned; ``page_stride`` bytes in all."""

    planes: tuple[KVPlaneGeometry, ...]
    page_tokens: int = 64

    def __post_init__(self) -> None:
        object.__setattr__(self, "planes", tuple(self.planes))
        if not self.planes:
            raise GeometryError("a page needs at least one plane")
        if self.page_tokens <= 0:
            raise GeometryError(f"page_tokens must be positive, not {self.page_tokens}")

    # Cached (a frozen dataclass's fields never change): every transfer checks the host
    # layout against them.
    @cached_property
    def plane_offsets(self) -> tuple[int, ...]:
        offsets, at = [], 0
        for plane in self.planes:
            at = align_up(at, plane.align)
            offsets.append(at)
            at += plane.payload_bytes(self.page_tokens)
        return tuple(offsets)

    @cached_property
    def page_stride(self) -> int:
        end = self.plane_offsets[-1] + self.planes[-1].payload_bytes(self.page_tokens)
        return align_up(end, max(p.align for p in self.planes))

    @property
    def payload_bytes(self) -> int:
        return sum(p.payload_bytes(self.page_tokens) for p in self.planes)


@dataclass(frozen=True)
class HostKVPageLayout:
    """Where a page's planes sit in pinned host memory: the device's layout, byte for byte, so a
    run of pages moves in one copy."""

    page_stride: int
    plane_offsets: tuple[int, ...]
    plane_bytes: tuple[int, ...]

    def payload_slices(self) -> tuple[slice, ...]:
        return self._slices

    @cached_property
    def _slices(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + n) for o, n in zip(self.plane_offsets, self.plane_bytes))


def plan_host_kv_page_layout(geometry: KVPageGeometry) -> HostKVPageLayout:
    """The host layout that mirrors ``geometry``'s device pages."""
    return HostKVPageLayout(
        page_stride=geometry.page_stride,
        plane_offsets=geometry.plane_offsets,
        plane_bytes=tuple(p.payload_bytes(geometry.page_tokens) for p in geometry.planes),
    )
