"""The one exception tree of kvcore.

Every error kvcore raises derives from :class:`KVCoreError`; CuPy's and the CUDA runtime's own
errors are translated into these in exactly one place (``kvcore/device/cuda.py``), so callers
never need to import cupy to catch a failure.
"""

from __future__ import annotations


class KVCoreError(Exception):
    """Root of every kvcore error. Catch this to handle any failure of the pool or its device."""


class DeviceUnavailableError(KVCoreError):
    """The requested device backend cannot run here.

    For ``cuda``: install the ``cuda`` extra (``pip install 'gpurace[cuda]'``, or ``cuda12`` for a
    CUDA 12 driver) and check that ``nvidia-smi`` sees a GPU. ``open_device("auto")`` falls back
    to the simulated device instead of raising this.
    """


class DeviceError(KVCoreError):
    """A CUDA call failed without killing the context: out of memory, an invalid argument,
    a kernel that did not compile. The message carries CUDA's own words."""


class DeviceFaultError(DeviceError):
    """The device context is dead: a kernel hit a device-side assert, an illegal address, or
    another sticky CUDA error.

    Every later call on this device fails the same way; only a new process recovers (that is why
    gpurace runs dangerous trials in worker processes). ``cuda_error`` names the CUDA error, e.g.
    ``CUDA_ERROR_ASSERT``.
    """

    def __init__(self, message: str, *, cuda_error: str = "CUDA_ERROR_UNKNOWN") -> None:
        super().__init__(message)
        self.cuda_error = cuda_error


class DeviceUsageError(KVCoreError):
    """A device call was given arguments it cannot honour: a byte range outside its buffer, a
    host-only call on a device buffer, or a buffer from another device. Fix the calling code."""


class PoolError(KVCoreError):
    """Base of the page pool's own errors."""


class PoolExhaustedError(PoolError):
    """The page pool has fewer free (unreserved) pages than asked for.

    Release leases you no longer need, or create the pool with more pages.
    """


class StaleHandleError(PoolError):
    """A page handle or lease was used after its page was released (its generation changed).

    The page may already belong to someone else; take a fresh lease with ``materialize``.
    """


class GeometryError(PoolError):
    """A page geometry, host layout or view does not fit what it is used with: check the
    plane list, the alignment (a power of two) and that host and pool geometries match."""


class TableError(PoolError):
    """An execution-table row is misused: unknown or unbound row, or more pages than a row holds.

    Create the KVExecutionTablePool with a larger ``max_pages_per_row`` or bind a row first.
    """
