"""kvcore: the paged KV page pool under test, on a real GPU (CuPy) or a simulated device.

Importing kvcore never imports cupy; only ``open_device("cuda")`` (or ``auto`` on a machine with
a GPU) does.

PYTEST_DONT_REWRITE: its asserts are not a test's. pytest, run under `gpurace watch`, finds
this package imported already and would warn that it cannot rewrite them.
"""

from __future__ import annotations

from kvcore.catalog import KVConversationCatalog
from kvcore.context import DeviceArena, DeviceContext
from kvcore.defects import Defects
from kvcore.device import Device, cuda_available, open_device
from kvcore.errors import (
    DeviceError,
    DeviceFaultError,
    DeviceUnavailableError,
    DeviceUsageError,
    GeometryError,
    KVCoreError,
    PoolError,
    PoolExhaustedError,
    StaleHandleError,
    TableError,
)
from kvcore.geometry import (
    DType,
    HostKVPageLayout,
    KVPageGeometry,
    KVPlaneGeometry,
    plan_host_kv_page_layout,
)
from kvcore.host import HostKVAllocation, HostKVAllocationView, HostKVArena, page_payload_equal
from kvcore.pool import (
    DeviceKVPageHandle,
    DeviceKVPageLease,
    DeviceKVPagePool,
    DeviceKVPageReservation,
)
from kvcore.table import KVExecutionTablePool, PageIndex

__all__ = [
    "DType", "Defects", "Device", "DeviceArena", "DeviceContext", "DeviceError",
    "DeviceFaultError", "DeviceKVPageHandle", "DeviceKVPageLease", "DeviceKVPagePool",
    "DeviceKVPageReservation", "DeviceUnavailableError", "DeviceUsageError", "GeometryError",
    "HostKVAllocation", "HostKVAllocationView", "HostKVArena", "HostKVPageLayout",
    "KVConversationCatalog", "KVCoreError", "KVExecutionTablePool", "KVPageGeometry",
    "KVPlaneGeometry", "PageIndex", "PoolError", "PoolExhaustedError", "StaleHandleError",
    "TableError",
    "cuda_available", "open_device", "page_payload_equal", "plan_host_kv_page_layout",
]
