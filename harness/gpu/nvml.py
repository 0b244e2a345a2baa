"""Everything the harness asks NVML (pynvml, from nvidia-ml-py): Xid events, GPU health, a summary.

Every NVML error is translated here, into a ``note`` or a None value with a reason: callers never
see ``pynvml.NVMLError``, nor the OSError/ImportError of a missing library. The pynvml module is
a parameter everywhere (``nvml=None`` imports it lazily), so tests pass a fake and the rest of the
harness imports this file on machines without a GPU.

Nothing here changes GPU state: no clocks, power, persistence, compute mode, MIG or reset calls.
Only queries and event registration, which other processes do not see.

NVML counts nvmlInit/nvmlShutdown pairs, so a snapshot taken while a watcher runs does not end the
watcher's session.
"""

from __future__ import annotations

import ctypes
import threading
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from harness.gpu.xid import XidInfo, describe, is_fatal

# Fallbacks for the event-type bits and query constants, used when a binding (or a test fake)
# lacks the names; the values are NVML's ABI and do not change.
_XID_BIT = 0x8
_SBE_BIT = 0x1
_DBE_BIT = 0x2
_NVML_ERROR_TIMEOUT = 10
_NVML_ERROR_NOT_SUPPORTED = 3


@dataclass(frozen=True)
class XidEvent:
    """One NVML event: ``xid`` is NVML's ``eventData`` (the Xid number for ``xid`` events),
    ``event_type`` is ``xid``, ``ecc-single``, ``ecc-double`` or ``event-0x…`` for others;
    ``gpu_index``/``gpu_uuid`` are None when the device could not be matched; times are
    :func:`time.time` and :func:`time.monotonic` when the watcher received it."""

    xid: int
    gpu_index: int | None
    gpu_uuid: str | None
    event_type: str
    wall_time: float
    monotonic_time: float

    @property
    def info(self) -> XidInfo:
        return describe(self.xid)

    @property
    def fatal(self) -> bool:
        """True when the GPU needs attention: a ``gpu-fatal`` Xid or a double-bit ECC error."""
        if self.event_type == "xid":
            return is_fatal(self.xid)
        return self.event_type == "ecc-double"


def _load(nvml: Any | None) -> tuple[Any | None, str]:
    if nvml is not None:
        return nvml, ""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"NVML is not available here: nvidia-ml-py is not installed ({exc})"
    return pynvml, ""


def _reason(exc: BaseException) -> str:
    # pynvml's __str__ asks the library for unknown codes; never let that raise here.
    try:
        text = str(exc)
    except Exception:
        text = ""
    return text or type(exc).__name__


def _is_error(nvml: Any, exc: BaseException, name: str, code: int) -> bool:
    cls = getattr(nvml, name, None)
    if isinstance(cls, type) and isinstance(exc, cls):
        return True
    return getattr(exc, "value", None) == code


def _init(nvml: Any) -> str:
    """nvmlInit; an empty string when it worked, else the note saying why not."""
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError (library or driver missing), OSError, ImportError
        return f"NVML is not available here: {_reason(exc)}"
    return ""


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass  # nothing useful to do about a failed shutdown


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _address(handle: Any) -> int | None:
    # pynvml handles are ctypes pointers, which compare by identity: the event's `device` is a
    # new pointer object to the same device, so compare the addresses they hold.
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except Exception:
        return None


def _same_device(a: Any, b: Any) -> bool:
    if a is b:
        return True
    addr_a, addr_b = _address(a), _address(b)
    if addr_a is not None and addr_b is not None:
        return addr_a == addr_b
    try:
        return bool(a == b)
    except Exception:
        return False


def cuda_visible(nvml: Any, env: Mapping[str, str] | None = None
                 ) -> tuple[list[int] | None, str]:
    """NVML's indices of the GPUs that CUDA shows this process, in CUDA's order, from
    ``CUDA_VISIBLE_DEVICES``; None when every GPU is visible or the list cannot be mapped, with a
    note saying why. ``nvml`` must be initialized.

    NVML ignores ``CUDA_VISIBLE_DEVICES``: without this, a run on GPU 1 would watch GPU 0 and
    take another job's Xids for its own. Entries are read as CUDA reads them: ordinals or
    ``GPU-`` UUID prefixes, and the list ends at the first entry that names no GPU (so an empty
    value hides them all). NVML numbers GPUs in PCI bus order, and so does CUDA when
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or when all the GPUs are the same model; otherwise CUDA puts
    the fastest first and an ordinal cannot be mapped. ``MIG-`` entries are not mapped either.
    """
    env = os.environ if env is None else env
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None, ""
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        models = {_text(nvml.nvmlDeviceGetName(h)) for h in handles}
    except Exception as exc:
        return None, f"cannot map CUDA_VISIBLE_DEVICES={value!r} to NVML: {_reason(exc)}"
    ordinals_match = len(models) <= 1 or env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    out: list[int] = []
    for entry in (e.strip() for e in value.split(",")):
        if entry.startswith("MIG-"):
            return None, f"CUDA_VISIBLE_DEVICES names a MIG instance ({entry}): watching every GPU"
        if entry.lstrip("-").isdigit():
            index = int(entry)
            if not ordinals_match:
                return None, ("the GPUs differ and CUDA_DEVICE_ORDER is not PCI_BUS_ID, so CUDA's "
                              "ordinals are not NVML's: watching every GPU (set "
                              "CUDA_DEVICE_ORDER=PCI_BUS_ID to watch only yours)")
            found = [index] if 0 <= index < len(handles) else []
        else:
            found = [i for i, u in enumerate(uuids) if u.startswith(entry)] if entry else []
        if len(found) != 1 or found[0] in out:
            break  # CUDA stops at an entry that names no GPU (or names one twice)
        out.append(found[0])
    return out, ""


def _first_visible(nvml: Any) -> tuple[int | None, str]:
    """The NVML index of the GPU a worker uses (CUDA's device 0), or None with why."""
    visible, note = cuda_visible(nvml)
    if visible is None:
        return 0, note
    if not visible:
        return None, "CUDA_VISIBLE_DEVICES hides every GPU"
    return visible[0], ""


def _event_bits(nvml: Any) -> tuple[int, int, int]:
    return (int(getattr(nvml, "nvmlEventTypeXidCriticalError", _XID_BIT)),
            int(getattr(nvml, "nvmlEventTypeSingleBitEccError", _SBE_BIT)),
            int(getattr(nvml, "nvmlEventTypeDoubleBitEccError", _DBE_BIT)))


class NvmlWatcher:
    """Collects NVML Xid (and ECC) events on a daemon thread while a run goes on.

    ``start()`` returns once registration is done (``available`` says whether it worked,
    ``note`` why not); ``stop()`` ends the thread within about ``wait_ms`` and releases NVML.
    ``on_event`` is called on the watcher thread for each event, so keep it short. One watcher
    watches once: make a new one for the next run. Usable as a context manager. It watches the
    GPUs ``indices`` (NVML's numbers), or by default those CUDA shows this process
    (:func:`cuda_visible`), which are the GPUs the run's workers use.
    """

    def __init__(self, nvml: Any | None = None, indices: Iterable[int] | None = None,
                 on_event: Callable[[XidEvent], None] | None = None, wait_ms: int = 500) -> None:
        self._nvml_arg = nvml
        self._indices = list(indices) if indices is not None else None
        self._on_event = on_event
        self.wait_ms = int(wait_ms)
        self._lock = threading.Lock()
        self._events: list[XidEvent] = []
        self._notes: list[str] = []
        self._devices: list[tuple[int, Any, str | None]] = []
        self._available = False
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.beat = time.monotonic()  # when the event wait last returned (it returns every
        # wait_ms with nothing to say): a wait stuck in the driver shows as an old beat

    # -- public ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> bool:
        """Start watching; return :attr:`available`. Waits up to ``timeout_s`` for NVML to
        finish registration."""
        if self._thread is not None:
            return self.available
        self._thread = threading.Thread(target=self._run, name="gpurace-nvml-watcher",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self._add_note(f"NVML did not finish event registration within {timeout_s:g} s")
        return self.available

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop watching: the thread ends within about ``wait_ms``, frees the event set and
        shuts NVML down. Safe to call twice, or without :meth:`start`."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout_s if timeout_s is not None else self.wait_ms / 1000 + 5.0)
            if thread.is_alive():
                self._add_note("the NVML watcher thread did not stop in time")

    def __enter__(self) -> NvmlWatcher:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def available(self) -> bool:
        """True when at least one GPU is registered for Xid events."""
        with self._lock:
            return self._available

    @property
    def note(self) -> str:
        """Why events are not (or not all) available; empty when all went well."""
        with self._lock:
            return "; ".join(self._notes)

    @property
    def events(self) -> list[XidEvent]:
        """A copy of the events received so far, oldest first."""
        with self._lock:
            return list(self._events)

    @property
    def watched(self) -> list[int]:
        """Indices of the GPUs registered for events."""
        with self._lock:
            return [index for index, _, _ in self._devices]

    def events_between(self, t0: float, t1: float) -> list[XidEvent]:
        """Events whose wall time lies in ``[t0, t1]`` (``time.time()`` values)."""
        return [e for e in self.events if t0 <= e.wall_time <= t1]

    # -- the watcher thread ---------------------------------------------------------------

    def _add_note(self, note: str) -> None:
        with self._lock:
            if note not in self._notes:
                self._notes.append(note)

    def _run(self) -> None:
        nvml, note = _load(self._nvml_arg)
        if nvml is None:
            self._add_note(note)
            self._ready.set()
            return
        note = _init(nvml)
        if note:
            self._add_note(note)
            self._ready.set()
            return
        event_set = None
        try:
            event_set = self._register(nvml)
            self._ready.set()
            if self.available:
                self._loop(nvml, event_set)
        except Exception as exc:  # the thread must end cleanly whatever NVML does
            self._add_note(f"the NVML watcher failed: {_reason(exc)}")
        finally:
            self._ready.set()
            if event_set is not None:
                try:
                    nvml.nvmlEventSetFree(event_set)
                except Exception as exc:
                    self._add_note(f"NVML could not free the event set: {_reason(exc)}")
            _shutdown(nvml)

    def _register(self, nvml: Any) -> Any | None:
        indices: Sequence[int]
        if self._indices is None:
            visible, note = cuda_visible(nvml)
            if note:
                self._add_note(note)
            try:
                indices = (range(int(nvml.nvmlDeviceGetCount())) if visible is None
                           else visible)
            except Exception as exc:
                self._add_note(f"NVML could not count GPUs: {_reason(exc)}")
                return None
        else:
            indices = self._indices
        if not indices:
            self._add_note("no NVIDIA GPU to watch")
            return None
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            self._add_note(f"NVML could not create an event set: {_reason(exc)}")
            return None
        for index in indices:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:
                self._add_note(f"GPU {index}: NVML has no handle for it: {_reason(exc)}")
                continue
            try:
                uuid: str | None = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception:
                uuid = None  # the index still identifies the GPU
            if self._register_device(nvml, event_set, index, handle):
                with self._lock:
                    self._devices.append((index, handle, uuid))
                    self._available = True
        return event_set

    def _register_device(self, nvml: Any, event_set: Any, index: int, handle: Any) -> bool:
        xid_bit, sbe_bit, dbe_bit = _event_bits(nvml)
        try:
            supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
        except Exception:
            supported = xid_bit  # cannot tell: ask for Xids alone and let registration decide
        if not supported & xid_bit:
            self._add_note(f"GPU {index}: this GPU does not support Xid events")
            return False
        mask = supported & (xid_bit | sbe_bit | dbe_bit)
        try:
            nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
            return True
        except Exception as exc:
            error: Exception = exc
        # Some drivers (vGPU, some containers) list ECC events as supported and then refuse
        # them; Xids alone are what the harness cannot do without.
        if mask != xid_bit and _is_error(nvml, error, "NVMLError_NotSupported",
                                         _NVML_ERROR_NOT_SUPPORTED):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, xid_bit, event_set)
                self._add_note(f"GPU {index}: ECC events refused; watching Xid events only")
                return True
            except Exception as exc:
                error = exc
        if _is_error(nvml, error, "NVMLError_NotSupported", _NVML_ERROR_NOT_SUPPORTED):
            self._add_note(f"GPU {index}: this GPU does not support Xid events")
        else:
            self._add_note(f"GPU {index}: cannot register for Xid events: {_reason(error)}")
        return False

    def _loop(self, nvml: Any, event_set: Any) -> None:
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        while not self._stop.is_set():
            self.beat = time.monotonic()
            try:
                data = wait(event_set, self.wait_ms)
            except Exception as exc:
                if _is_error(nvml, exc, "NVMLError_Timeout", _NVML_ERROR_TIMEOUT):
                    continue  # nothing happened within wait_ms
                self._add_note(f"waiting for NVML events failed: {_reason(exc)}")
                # Back off so a lasting failure (GPU lost) does not spin a core.
                self._stop.wait(self.wait_ms / 1000)
                continue
            wall, mono = time.time(), time.monotonic()
            self._deliver(self._event_from(nvml, data, wall, mono))

    def _event_from(self, nvml: Any, data: Any, wall: float, mono: float) -> XidEvent:
        xid_bit, sbe_bit, dbe_bit = _event_bits(nvml)
        etype = int(getattr(data, "eventType", 0) or 0)
        names = {xid_bit: "xid", sbe_bit: "ecc-single", dbe_bit: "ecc-double"}
        index, uuid = self._which(getattr(data, "device", None))
        return XidEvent(xid=int(getattr(data, "eventData", 0) or 0), gpu_index=index,
                        gpu_uuid=uuid, event_type=names.get(etype, f"event-0x{etype:x}"),
                        wall_time=wall, monotonic_time=mono)

    def _which(self, device: Any) -> tuple[int | None, str | None]:
        with self._lock:
            devices = list(self._devices)
        for index, handle, uuid in devices:
            if _same_device(handle, device):
                return index, uuid
        if len(devices) == 1:
            return devices[0][0], devices[0][2]  # only one GPU can have sent it
        return None, None

    def _deliver(self, event: XidEvent) -> None:
        with self._lock:
            self._events.append(event)
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception as exc:  # a broken callback must not stop the watching
                self._add_note(f"on_event raised {type(exc).__name__}: {exc}")


_RESET_REQUIRED = 16
"""NVML_ERROR_RESET_REQUIRED: the driver answers a GPU that must be reset with this code
("GPU requires restart")."""


class _Fields:
    """Reads one field at a time: a failure leaves None and a note under the field's name;
    ``reset_required`` tells whether any read was refused because the GPU must be reset."""

    def __init__(self, notes: dict[str, str], nvml: Any = None) -> None:
        self.notes = notes
        self.nvml = nvml
        self.reset_required = ""

    def read(self, key: str, query: Callable[[], Any]) -> Any:
        # Any exception, not only NVMLError: an older binding may lack the function entirely.
        try:
            return query()
        except Exception as exc:
            self.notes[key] = _reason(exc)
            if _is_error(self.nvml, exc, "NVMLError_ResetRequired", _RESET_REQUIRED):
                self.reset_required = self.reset_required or f"{key}: {self.notes[key]}"
            return None


def _needs_reset(mod: Any, handle: Any, fields: _Fields) -> str:
    """Why GPU ``handle`` must be reset before it runs anything, or "": the driver refused a
    query for that reason, or NVML's recovery action for it is not "none" (drivers from 550)."""
    if fields.reset_required:
        return f"the driver says the GPU requires a reset ({fields.reset_required})"
    field_id = getattr(mod, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field_id is None:
        return ""
    try:
        [value] = mod.nvmlDeviceGetFieldValues(handle, [field_id])
        if int(value.nvmlReturn) != 0:
            return ""  # a driver that does not know the field: nothing to say
        action = int(value.value.uiVal)
    except Exception:
        return ""
    if action == int(getattr(mod, "NVML_GPU_RECOVERY_ACTION_NONE", 0)):
        return ""
    names = {int(getattr(mod, k)): k.removeprefix("NVML_GPU_RECOVERY_ACTION_").lower()
             .replace("_", " ") for k in dir(mod) if k.startswith("NVML_GPU_RECOVERY_ACTION_")}
    return f"NVML's recovery action for the GPU is {names.get(action, str(action))!r}"


def _cuda_version(value: int) -> str:
    value = int(value)
    return f"{value // 1000}.{(value % 1000) // 10}"


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else round(int(milliwatts) / 1000, 1)


def _mib(nbytes: Any) -> int | None:
    return None if nbytes is None else int(nbytes) // (1 << 20)


def health_snapshot(nvml: Any | None = None, index: int | str | None = None
                    ) -> dict[str, Any]:
    """What NVML says about GPU ``index`` (NVML's number, or the GPU's UUID; by default the GPU
    the run's workers use, CUDA's device 0) now, for a report: identity, clocks, temperature,
    power, memory, ECC, remapped rows, processes, and ``needs_reset``: why the GPU must be reset
    before it runs anything (the driver refuses its queries until then, or NVML names a recovery
    action), empty when it need not.

    Never raises. Each field is read on its own; one that fails is None, with the reason in
    ``notes[field]``. When NVML or the GPU is missing, ``available`` is False and ``note`` says
    why.
    """
    snap: dict[str, Any] = {
        "available": False, "note": "", "notes": {}, "needs_reset": "", "index": index,
        "name": None, "uuid": None, "driver_version": None, "cuda_driver_version": None,
        "compute_capability": None, "clocks_mhz": None, "max_clocks_mhz": None,
        "temperature_c": None, "power_w": None, "power_limit_w": None, "memory": None,
        "ecc": None, "remapped_rows": None, "processes": None,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    mod, note = _load(nvml)
    if mod is None:
        snap["note"] = note
        return snap
    note = _init(mod)
    if note:
        snap["note"] = note
        return snap
    try:
        if index is None:
            index, why = _first_visible(mod)
            snap["index"] = index
            if why:
                snap["notes"]["index"] = why
            if index is None:
                snap["note"] = why
                return snap
        try:
            if isinstance(index, str):
                handle = mod.nvmlDeviceGetHandleByUUID(index)
                snap["index"] = int(mod.nvmlDeviceGetIndex(handle))
            else:
                handle = mod.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            snap["note"] = f"NVML has no GPU {index}: {_reason(exc)}"
            return snap
        snap["available"] = True
        fields = _Fields(snap["notes"], mod)
        _fill_snapshot(snap, mod, handle, fields)
        snap["needs_reset"] = _needs_reset(mod, handle, fields)
    except Exception as exc:  # a bug above must not cost the caller its report
        snap["note"] = f"the NVML snapshot failed: {_reason(exc)}"
    finally:
        _shutdown(mod)
    return snap


def _fill_snapshot(snap: dict[str, Any], mod: Any, handle: Any, f: _Fields) -> None:
    clock_sm = getattr(mod, "NVML_CLOCK_SM", 1)
    clock_mem = getattr(mod, "NVML_CLOCK_MEM", 2)
    snap["name"] = f.read("name", lambda: _text(mod.nvmlDeviceGetName(handle)))
    snap["uuid"] = f.read("uuid", lambda: _text(mod.nvmlDeviceGetUUID(handle)))
    snap["driver_version"] = f.read("driver_version",
                                    lambda: _text(mod.nvmlSystemGetDriverVersion()))
    snap["cuda_driver_version"] = f.read(
        "cuda_driver_version", lambda: _cuda_version(mod.nvmlSystemGetCudaDriverVersion()))
    snap["compute_capability"] = f.read(
        "compute_capability",
        lambda: "{}.{}".format(*mod.nvmlDeviceGetCudaComputeCapability(handle)))
    snap["clocks_mhz"] = {
        "sm": f.read("clocks_mhz.sm", lambda: int(mod.nvmlDeviceGetClockInfo(handle, clock_sm))),
        "mem": f.read("clocks_mhz.mem",
                      lambda: int(mod.nvmlDeviceGetClockInfo(handle, clock_mem))),
    }
    snap["max_clocks_mhz"] = {
        "sm": f.read("max_clocks_mhz.sm",
                     lambda: int(mod.nvmlDeviceGetMaxClockInfo(handle, clock_sm))),
        "mem": f.read("max_clocks_mhz.mem",
                      lambda: int(mod.nvmlDeviceGetMaxClockInfo(handle, clock_mem))),
    }
    snap["temperature_c"] = f.read("temperature_c", lambda: int(mod.nvmlDeviceGetTemperature(
        handle, getattr(mod, "NVML_TEMPERATURE_GPU", 0))))
    snap["power_w"] = _watts(f.read("power_w", lambda: mod.nvmlDeviceGetPowerUsage(handle)))
    snap["power_limit_w"] = _watts(
        f.read("power_limit_w", lambda: mod.nvmlDeviceGetEnforcedPowerLimit(handle)))
    memory = f.read("memory", lambda: mod.nvmlDeviceGetMemoryInfo(handle))
    if memory is not None:
        snap["memory"] = {"total_mib": _mib(memory.total), "used_mib": _mib(memory.used)}
    snap["ecc"] = _ecc(mod, handle, f)
    rows = f.read("remapped_rows", lambda: mod.nvmlDeviceGetRemappedRows(handle))
    if rows is not None:
        corr, unc, pending, failure = rows
        snap["remapped_rows"] = {"correctable": int(corr), "uncorrectable": int(unc),
                                 "pending": bool(pending), "failure": bool(failure)}
    procs = f.read("processes", lambda: list(mod.nvmlDeviceGetComputeRunningProcesses(handle)))
    if procs is not None:
        snap["processes"] = [
            {"pid": int(p.pid), "used_mib": _mib(getattr(p, "usedGpuMemory", None))}
            for p in procs]


def _ecc(mod: Any, handle: Any, f: _Fields) -> dict[str, Any] | None:
    mode = f.read("ecc", lambda: mod.nvmlDeviceGetEccMode(handle))
    if mode is None:
        return None  # GPUs without ECC answer NotSupported; the note says so
    current = mode[0] if isinstance(mode, list | tuple) else mode
    enabled = current == getattr(mod, "NVML_FEATURE_ENABLED", 1)
    uncorrected = getattr(mod, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile = getattr(mod, "NVML_VOLATILE_ECC", 0)
    aggregate = getattr(mod, "NVML_AGGREGATE_ECC", 1)
    return {
        "mode": "enabled" if enabled else "disabled",
        "volatile_uncorrected": f.read("ecc.volatile_uncorrected", lambda: int(
            mod.nvmlDeviceGetTotalEccErrors(handle, uncorrected, volatile))),
        "aggregate_uncorrected": f.read("ecc.aggregate_uncorrected", lambda: int(
            mod.nvmlDeviceGetTotalEccErrors(handle, uncorrected, aggregate))),
    }


def nvml_summary(nvml: Any | None = None) -> dict[str, Any]:
    """For ``gpurace doctor``: whether NVML works, the driver, the GPUs, and whether Xid events
    can be registered (checked by registering and freeing at once, without waiting).

    ``xid_events`` is ``supported``, ``not supported``, or the reason it could not be checked.
    Never raises.
    """
    out: dict[str, Any] = {"available": False, "note": "", "driver_version": None,
                           "cuda_driver_version": None, "device_count": 0, "devices": [],
                           "xid_events": "not checked"}
    mod, note = _load(nvml)
    if mod is None:
        out["note"] = out["xid_events"] = note
        return out
    note = _init(mod)
    if note:
        out["note"] = out["xid_events"] = note
        return out
    try:
        out["available"] = True
        notes: dict[str, str] = {}
        f = _Fields(notes)
        out["driver_version"] = f.read("driver_version",
                                       lambda: _text(mod.nvmlSystemGetDriverVersion()))
        out["cuda_driver_version"] = f.read(
            "cuda_driver_version", lambda: _cuda_version(mod.nvmlSystemGetCudaDriverVersion()))
        count = f.read("device_count", lambda: int(mod.nvmlDeviceGetCount()))
        out["device_count"] = count or 0
        handles = []
        for i in range(out["device_count"]):
            handle = f.read(f"devices[{i}]", lambda i=i: mod.nvmlDeviceGetHandleByIndex(i))
            if handle is None:
                continue
            handles.append((i, handle))
            out["devices"].append({
                "index": i,
                "name": f.read(f"devices[{i}].name",
                               lambda h=handle: _text(mod.nvmlDeviceGetName(h))),
                "uuid": f.read(f"devices[{i}].uuid",
                               lambda h=handle: _text(mod.nvmlDeviceGetUUID(h))),
            })
        out["xid_events"] = _xid_support(mod, handles)
        out["note"] = "; ".join(f"{k}: {v}" for k, v in notes.items())
    except Exception as exc:
        out["note"] = f"the NVML summary failed: {_reason(exc)}"
    finally:
        _shutdown(mod)
    return out


def _xid_support(mod: Any, handles: list[tuple[int, Any]]) -> str:
    if not handles:
        return "no GPU to check"
    xid_bit = _event_bits(mod)[0]
    try:
        event_set = mod.nvmlEventSetCreate()
    except Exception as exc:
        return f"NVML could not create an event set: {_reason(exc)}"
    try:
        for index, handle in handles:
            try:
                supported = int(mod.nvmlDeviceGetSupportedEventTypes(handle))
            except Exception:
                supported = xid_bit  # cannot tell: registering below decides
            if not supported & xid_bit:
                return "not supported"
            try:
                mod.nvmlDeviceRegisterEvents(handle, xid_bit, event_set)
            except Exception as exc:
                if _is_error(mod, exc, "NVMLError_NotSupported", _NVML_ERROR_NOT_SUPPORTED):
                    return "not supported"
                return f"GPU {index}: {_reason(exc)}"
        return "supported"
    finally:
        try:
            mod.nvmlEventSetFree(event_set)
        except Exception:
            pass  # the check's answer stands either way


def visible_gpus(nvml: Any | None = None) -> list[int]:
    """NVML's indices of the GPUs CUDA shows this process (every GPU when it cannot tell);
    empty without NVML. Never raises."""
    return [index for index, _ in _visible(nvml)]


def visible_uuids(nvml: Any | None = None) -> list[str]:
    """The UUIDs of the same GPUs, whether CUDA can use them or not: a GPU that must be reset
    is one CUDA no longer shows. Never raises."""
    return [uuid for _, uuid in _visible(nvml)]


def _visible(nvml: Any | None) -> list[tuple[int, str]]:
    """NVML's index and UUID of each GPU CUDA_VISIBLE_DEVICES leaves this process."""
    mod, _ = _load(nvml)
    if mod is None or _init(mod):
        return []
    try:
        visible, _ = cuda_visible(mod)
        indices = range(int(mod.nvmlDeviceGetCount())) if visible is None else visible
        return [(i, _text(mod.nvmlDeviceGetUUID(mod.nvmlDeviceGetHandleByIndex(i))))
                for i in indices]
    except Exception:
        return []
    finally:
        _shutdown(mod)


def other_gpu_processes(index: int | None = None, nvml: Any | None = None,
                        me: int | None = None) -> tuple[list[int], str]:
    """PIDs of processes other than ``me`` (this process when not given) with a compute context
    on GPU ``index`` (by default the workers' GPU), and a note when NVML could not tell (no
    NVML, no GPU, no permission): then the list is empty and the caller decides."""
    snap = health_snapshot(nvml, index)
    if not snap.get("available"):
        return [], str(snap.get("note") or "NVML is not available")
    if snap.get("processes") is None:
        return [], str((snap.get("notes") or {}).get("processes", "process list unavailable"))
    me = os.getpid() if me is None else me
    return sorted({int(p["pid"]) for p in snap["processes"] if int(p["pid"]) != me}), ""
