"""What the harness asks NVML about the GPU before dangerous work (pynvml from nvidia-ml-py).

All NVML errors stay here: callers get plain values, or an empty answer with a reason.
"""

from __future__ import annotations

import os


def other_gpu_processes(index: int = 0) -> tuple[list[int], str]:
    """PIDs of other processes with a context on GPU ``index``, and a note when NVML could not
    tell (no NVML, no GPU, no permission): then the list is empty and the caller decides."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError and the library-not-found errors
        return [], f"NVML is not available: {exc}"
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        procs = list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        procs += list(pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
    except Exception as exc:
        return [], f"NVML could not list GPU processes: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    me = os.getpid()
    return sorted({p.pid for p in procs if p.pid != me}), ""
