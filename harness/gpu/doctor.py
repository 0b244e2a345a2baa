"""`gpurace doctor`: what works on this machine, checked one thing at a time.

Every check catches its own failure and says what it saw, so the report itself can always be
made (its exit code is 0); the verdict says which backends and which kinds of watching work.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any

import kvcore

from harness.gpu.kernlog import KernelLog
from harness.gpu.nvml import (
    health_snapshot,
    nvml_summary,
    other_gpu_processes,
    visible_gpus,
)


def _check(name: str, ok: bool, detail: str, **data: Any) -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail, **data}


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cuda_count() -> int:
    """How many GPUs CUDA shows this process."""
    from kvcore.device.cuda import device_uuids

    try:
        return len(device_uuids())
    except Exception:  # a driver that answered the check a moment ago and not now
        return 0


def diagnose() -> dict[str, Any]:
    """All checks and the verdict, as a JSON-able dict."""
    version = _version("gpurace")
    shown = f"gpurace {version}" if version != "not installed" else \
        "gpurace from source (not installed as a package)"
    checks = [_check("gpurace", True, f"{shown} on Python {platform.python_version()} "
                     f"({sys.platform})")]

    cuda_ok, cuda_why = kvcore.cuda_available()
    cupy = _version("cupy-cuda13x")
    if cupy == "not installed":
        cupy = _version("cupy-cuda12x")
    checks.append(_check("CuPy", cupy != "not installed",
                         f"cupy {cupy}" if cupy != "not installed" else
                         "not installed: pip install 'gpurace[cuda]' (or [cuda12]) on a GPU host"))
    checks.append(_check("CUDA device", cuda_ok, cuda_why))

    nvml = nvml_summary()
    if nvml.get("available"):
        names = ", ".join(f"{d.get('index')}: {d.get('name')}" for d in nvml.get("devices", []))
        detail = (f"driver {nvml.get('driver_version')}, CUDA {nvml.get('cuda_driver_version')}"
                  f", {nvml.get('device_count')} GPU(s): {names}")
    else:
        detail = str(nvml.get("note"))
    checks.append(_check("NVML", bool(nvml.get("available")), detail, nvml=nvml))
    xid = nvml.get("xid_events")
    checks.append(_check("NVML Xid events", xid == "supported", str(xid)))

    klog = KernelLog()
    checks.append(_check("kernel log (NVRM: Xid lines)", klog.start(),
                         "readable" if klog.available else klog.note))
    klog.close()

    if nvml.get("available"):
        # Every GPU a run may use (--gpus all takes them all): after a soak, each must be well.
        gpus = visible_gpus()
        for index in gpus:
            health = health_snapshot(index=index)
            reset = health.get("needs_reset")
            detail = (f"needs a reset: {reset}; gpurace runs nothing on it" if reset else
                      f"{health.get('temperature_c')} C, {health.get('power_w')} W, SM "
                      f"{(health.get('clocks_mhz') or {}).get('sm')} MHz, ECC "
                      f"{health.get('ecc')}, remapped rows {health.get('remapped_rows')}")
            name = "GPU health" if len(gpus) == 1 else f"GPU {index} health ({health.get('uuid')})"
            checks.append(_check(name, bool(health.get("available")) and not reset, detail,
                                 health=health))
        if cuda_ok and (count := _cuda_count()) < len(gpus):
            checks.append(_check("CUDA sees every GPU", False,
                                 f"CUDA shows {count} of the {len(gpus)} GPUs NVML sees: the "
                                 "others cannot run work (see their health above)"))
        pids, note = other_gpu_processes()
        checks.append(_check("other GPU processes", not pids,
                             note or (f"pids {pids}" if pids else "none")))

    sim_ok, sim_detail = _sim_works()
    checks.append(_check("simulated device", sim_ok, sim_detail))

    verdict = []
    if cuda_ok:
        verdict.append("cuda backend: usable; `gpurace run smoke` runs on the GPU")
    else:
        verdict.append(f"cuda backend: not usable here ({cuda_why})")
    verdict.append("sim backend: " + ("usable; every scenario runs on it, dangerous ones too, "
                                      "with no GPU" if sim_ok else f"broken: {sim_detail}"))
    watching = [name for name, ok in (("NVML Xid events", xid == "supported"),
                                      ("the kernel log", klog.available)) if ok]
    verdict.append("Xids: seen through " + " and ".join(watching) if watching else
                   "Xids: not visible here; crash reports will say so and still carry the "
                   "CUDA error, the last ops and the reproduce command")
    return {"schema": "gpurace.doctor/1", "checks": checks, "verdict": verdict}


def _sim_works() -> tuple[bool, str]:
    """A tiny program on the simulated device: fill, copy back, compare."""
    try:
        device = kvcore.open_device("sim")
        stream = device.create_stream("s")
        host = device.alloc_host(4096, name="h")
        buf = device.alloc(4096, name="d")
        device.host_fill(host, 0, 4096, 0x5A)
        device.copy(buf, 0, host, 0, 4096, stream)
        # The copy reads pinned memory when it runs, not when issued: wait before reusing it.
        device.synchronize_stream(stream)
        device.host_fill(host, 0, 4096, 0)
        device.copy(host, 0, buf, 0, 4096, stream)
        device.synchronize_stream(stream)
        ok = bool((device.host_read(host, 0, 4096) == 0x5A).all())
        return ok, "a copy round trip works" if ok else "a copy round trip lost data"
    except kvcore.KVCoreError as exc:
        return False, str(exc)
