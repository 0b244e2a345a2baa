"""The flight recorder: a trial's op trace on disk, current up to the last time the host blocked.

A worker may die at any moment (a device-side assert surfaces at a synchronize; a hang blocks in
one until the watchdog kills it). So the recorder keeps records in memory while the host issues
work, and writes them to the trial's trace file just before every blocking call. Whatever the
worker's fate, the parent then finds every op issued before the fatal wait.

The trace file is versioned JSON Lines: a header record, then "buffer" and "op" records.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from kvcore.device import Device, OpRecord

TRACE_SCHEMA = "gpurace.trace/1"
CURRENT = "trial-current.jsonl"


def trace_path(folder: Path, index: int) -> Path:
    """Where a finished trial's trace is kept when the trial was not clean."""
    return folder / f"trial-{index:06d}.jsonl"


class FlightRecorder:
    """Records every op of the devices it is attached to into ``folder/trial-current.jsonl``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / CURRENT
        self._file: IO[str] | None = None
        self._pending: list[OpRecord] = []
        self._device: Device | None = None
        self._announced: set[int] = set()
        self.total = 0

    def attach(self, device: Device) -> None:
        """Observe ``device`` (a new one each trial on sim, one for all trials on cuda)."""
        if device is self._device:
            return
        self._device = device
        self._announced = set()
        device.oplog.subscribe(self._pending.append)
        device.oplog.before_blocking(self.flush)

    def start_trial(self, header: dict[str, Any]) -> None:
        """Begin a trial's trace: a fresh file with its header line."""
        self.close()
        self._pending.clear()
        self.total = 0
        self._announced = set()
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - kept open per trial
        self._file.write(json.dumps({"type": "header", "schema": TRACE_SCHEMA, "level": "ops",
                                     **header}, separators=(",", ":")) + "\n")
        self._file.flush()

    def flush(self) -> None:
        """Write what was issued since the last flush; called before every blocking call."""
        if self._file is None or not self._pending:
            return
        lines = []
        if self._device is not None:
            for info in self._device.oplog.buffers.values():
                if info.id not in self._announced:
                    self._announced.add(info.id)
                    lines.append(json.dumps({"type": "buffer", "id": info.id, "name": info.name,
                                             "space": info.space, "nbytes": info.nbytes,
                                             "role": info.role}, separators=(",", ":")))
        for record in self._pending:
            data = record.to_json()
            data["type"] = "op"
            lines.append(json.dumps(data, separators=(",", ":"), default=str))
        self.total += len(self._pending)
        self._pending.clear()
        self._file.write("\n".join(lines) + "\n")
        # Into the kernel's page cache: enough to outlive this process (not a machine crash).
        self._file.flush()

    def end_trial(self, index: int, keep: bool) -> str | None:
        """Close the trial's trace; keep it (renamed for the parent) when ``keep``."""
        self.flush()
        self.close()
        if not keep:
            return None
        kept = trace_path(self.folder, index)
        os.replace(self.path, kept)
        return str(kept)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_trace(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(header, buffers, ops) of a trace file; a torn last line (a worker killed mid-write) is
    dropped, not fatal."""
    header: dict[str, Any] = {}
    buffers: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = record.get("type")
            if kind == "header":
                header = record
            elif kind == "buffer":
                buffers.append(record)
            elif kind == "op":
                ops.append(record)
    return header, buffers, ops
