"""NVIDIA Xid numbers: what each means, and whether the GPU itself needs attention.

An Xid is the driver's error report, seen in the kernel log (``NVRM: Xid (PCI:…): 43, …``) and
in NVML's Xid events (``eventData`` 43). The harness sorts them into three classes:

- ``application``: a process's CUDA context died (device-side assert, illegal address, …); the
  GPU is fine and the next process can use it. Dangerous trials cause exactly these, on purpose.
- ``gpu-fatal``: the GPU needs attention (memory errors, NVLink, GSP, fallen off the bus). Stop
  the run, keep the evidence, and have the GPU reset or serviced; the harness never resets one.
- ``unknown``: a number not in this table. It does not stop a run (most Xids a race can cause
  are application-level, and stopping on every unknown number would make newer drivers unusable)
  but it is always reported, so a person can look it up in NVIDIA's Xid catalog.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

XidClass = Literal["application", "gpu-fatal", "unknown"]

APPLICATION = "application"
GPU_FATAL = "gpu-fatal"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class XidInfo:
    """One Xid number, a short meaning and its class (``application``, ``gpu-fatal`` or
    ``unknown``)."""

    xid: int
    meaning: str
    klass: XidClass

    @property
    def fatal(self) -> bool:
        """True when the GPU needs a reset or service before more work runs on it."""
        return self.klass == GPU_FATAL


# Meanings are short on purpose: the report shows them next to the number; NVIDIA's catalog
# has the full causes and actions.
_TABLE: dict[int, tuple[str, XidClass]] = {
    13: ("Graphics engine exception (an illegal instruction, out-of-range access or assert in a "
         "kernel)", "application"),
    31: ("GPU memory page fault (illegal address from a kernel)", "application"),
    43: ("GPU stopped processing (the context hit a device-side assert or trap and was torn "
         "down)", "application"),
    45: ("Preemptive cleanup after a process ended (often follows 13/31/43)", "application"),
    48: ("Double-bit ECC error in GPU memory", "gpu-fatal"),
    61: ("Internal micro-controller breakpoint/warning", "gpu-fatal"),
    62: ("Internal micro-controller halt", "gpu-fatal"),
    63: ("ECC page retirement or row remapping recorded (reset the GPU to apply it)", "gpu-fatal"),
    64: ("ECC page retirement or row remapping failed", "gpu-fatal"),
    68: ("Video processor (NVDEC) exception", "application"),
    74: ("NVLink error", "gpu-fatal"),
    79: ("GPU has fallen off the bus", "gpu-fatal"),
    92: ("High single-bit ECC error rate", "gpu-fatal"),
    94: ("Contained ECC error (the affected process was stopped; reset the GPU to remap rows)",
         "gpu-fatal"),
    95: ("Uncontained ECC error (every process on the GPU is affected; reset required)",
         "gpu-fatal"),
    109: ("Context switch timeout", "application"),
    119: ("GSP RPC timeout (the GPU System Processor stopped answering the driver)", "gpu-fatal"),
    120: ("GSP error (the GPU System Processor reported a fault)", "gpu-fatal"),
    154: ("GPU recovery action changed (the driver says the GPU needs a reset or a reboot "
          "before it runs anything)", "gpu-fatal"),
}

APPLICATION_XIDS: frozenset[int] = frozenset(
    n for n, (_, klass) in _TABLE.items() if klass == APPLICATION)
FATAL_XIDS: frozenset[int] = frozenset(n for n, (_, klass) in _TABLE.items() if klass == GPU_FATAL)


def describe(xid: int) -> XidInfo:
    """What Xid ``xid`` means and its class; a number not in the table gets class ``unknown``
    with a meaning that says to look it up."""
    known = _TABLE.get(int(xid))
    if known is None:
        return XidInfo(int(xid), "not in gpurace's table; see NVIDIA's Xid catalog", "unknown")
    meaning, klass = known
    return XidInfo(int(xid), meaning, klass)


def is_fatal(xid: int) -> bool:
    """True only for ``gpu-fatal`` Xids: stop the run and leave the GPU to an operator.

    ``application`` and ``unknown`` Xids return False: the run goes on (each trial runs in its
    own process) and the Xid is reported with the trial.
    """
    return int(xid) in FATAL_XIDS
