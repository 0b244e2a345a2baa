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

from harness.errors import TraceError
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
        self._streams: set[str] = set()
        self.total = 0

    def attach(self, device: Device) -> None:
        """Observe ``device`` (a new one each trial on sim, one for all trials on cuda)."""
        if device is self._device:
            return
        self._device = device
        self._announced = set()
        self._streams = set()
        device.oplog.subscribe(self._pending.append)
        device.oplog.before_blocking(self.flush)

    def start_trial(self, header: dict[str, Any]) -> None:
        """Begin a trial's trace: a fresh file with its header line."""
        self.close()
        self._pending.clear()
        self.total = 0
        self._announced = set()
        self._streams = set()
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
                                             "legacy": stream.legacy}, separators=(",", ":")))
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


def load_trace(path: Path) -> tuple[list[dict[str, Any]], str]:
    """Every record of a trace file, checked line by line; and a note when its last line was
    torn (a worker killed mid-write), which is dropped rather than refused."""
    records: list[dict[str, Any]] = []
    note = ""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read it: {exc}") from exc
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                note = f"{path}:{number}: the last line is torn (a killed writer); ignored"
                break
            raise TraceError(f"{path}:{number}: not a JSON record ({exc.msg})") from exc
        if not isinstance(record, dict) or "type" not in record:
            raise TraceError(f"{path}:{number}: a record needs a \"type\"")
        if number == 1 and (record["type"] != "header" or record.get("schema") != TRACE_SCHEMA):
            raise TraceError(f"{path}:1: not a gpurace op trace: the first line must be a "
                             f"header with schema {TRACE_SCHEMA}")
        need = _NEEDS.get(record["type"])
        if need is None:
            raise TraceError(f"{path}:{number}: unknown record type {record['type']!r}")
        missing = [k for k in need if k not in record]
        if missing:
            raise TraceError(f"{path}:{number}: a {record['type']} record needs "
                             f"{', '.join(missing)}")
        records.append(record)
    if not records:
        raise TraceError(f"{path}:1: empty trace")
    return records, note


_NEEDS = {"header": ("schema",), "buffer": ("id", "name", "space"),
          "stream": ("name", "blocking", "legacy"), "op": ("seq", "stream", "kind")}
