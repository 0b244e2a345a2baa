"""The flight recorder: a trial's op trace on disk, current up to the last time the host blocked.

A worker may die at any moment (a device-side assert surfaces at a synchronize; a hang blocks in
one until the watchdog kills it). So the recorder keeps records in memory while the host issues
work, and writes them to the trial's trace file just before every blocking call. Whatever the
worker's fate, the parent then finds every op issued before the fatal wait.

The trace file is versioned JSON Lines (:mod:`harness.traces.optrace` describes and reads it).
A worker killed in the middle of a write leaves a torn last line; :func:`cut_torn_tail` is how
the parent takes such a file in, so every reader after it can be strict.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from harness.traces.optrace import TRACE_SCHEMA
from kvcore.device import Device, OpRecord
from kvcore.device.oplog import Label

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
        self._streams: set[str] = set()
        self._labels: list[Label] = []
        self.total = 0

    def attach(self, device: Device) -> None:
        """Observe ``device`` (a new one each trial on sim, one for all trials on cuda)."""
        if device is self._device:
            return
        self._device = device
        self._announced = set()
        self._streams = set()
        self._labels = device.oplog.labels.live()
        device.oplog.subscribe(self._pending.append)
        device.oplog.before_blocking(self.flush)

    def start_trial(self, header: dict[str, Any]) -> None:
        """Begin a trial's trace: a fresh file with its header line."""
        self.close()
        self._pending.clear()
        self.total = 0
        self._announced = set()
        self._streams = set()
        self._labels = self._device.oplog.labels.live() if self._device is not None else []
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
            log = self._device.oplog
            for info in log.buffers.values():
                if info.id not in self._announced:
                    self._announced.add(info.id)
                    lines.append(json.dumps({"type": "buffer", "id": info.id, "name": info.name,
                                             "space": info.space, "nbytes": info.nbytes,
                                             "role": info.role,
                                             "page_bytes": log.page_bytes.get(info.id, 0)},
                                            separators=(",", ":")))
            for stream in log.streams.values():
                if stream.name not in self._streams:
                    self._streams.add(stream.name)
                    lines.append(json.dumps({"type": "stream", "name": stream.name,
                                             "blocking": stream.blocking,
                                             "legacy": stream.legacy,
                                             "priority": stream.priority},
                                            separators=(",", ":")))
            # Who owned which bytes when the trial began (a world's buffers outlive trials);
            # later changes are the trace's alloc and free ops.
            for label in self._labels:
                lines.append(json.dumps({"type": "label", "buffer": label.buffer,
                                         "offset": label.offset, "length": label.length,
                                         "name": label.name}, separators=(",", ":")))
            self._labels = []
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


def cut_torn_tail(path: Path) -> bool:
    """Cut a torn last line (a writer killed mid-line) off ``path``; whether there was one.

    The recorder writes whole lines, so only the end of the file can be torn, and only when its
    process died in the write; what came before is intact and is what the parent keeps.
    """
    with open(path, "rb+") as file:
        data = file.read()
        if not data or data.endswith(b"\n"):
            return False
        file.truncate(data.rfind(b"\n") + 1)
        return True
