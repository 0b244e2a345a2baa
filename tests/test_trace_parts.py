"""A long watched run's trace in parts (harness.capture.analysis): begun anew at quiet points
once over its size, an earlier part kept only for the races found in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.capture import analysis as A
from harness.capture.analysis import RunAnalysis
from harness.races.detector import check_trace
from harness.traces.optrace import load_trace
from tests.test_capture import _serving_steps

START = [["hello", {"schema": "gpurace.capture/1", "pid": 1}],
         ["stream", 0, {"blocking": False, "legacy": True}],
         ["stream", 5, {"blocking": False, "legacy": False}],
         ["event", "ready", {"site": "serve.py:1"}],
         ["event", "done", {"site": "serve.py:2"}],
         # a tensor that lives the whole run: each part must still name its bytes
         ["alloc", "d", 0x20000, 8192, {"what": "tensor float32[2048]", "site": "serve.py:0",
                                         "source": "torch", "stream": 0}]]


def _run(tmp_path: Path, racy_steps: set[int], steps: int, part_bytes: int
         ) -> RunAnalysis:
    analysis = RunAnalysis(tmp_path / "trace.jsonl", {"scenario": "serve"},
                           part_bytes=part_bytes)
    analysis.feed(START)
    for step in range(steps):
        analysis.feed(_serving_steps(step, 1, racy=step in racy_steps))
    analysis.close()
    return analysis


def _checked(path: Path) -> list[dict[str, Any]]:
    return [f.to_json() for f in check_trace(load_trace(path).records).findings]


def _where(finding: dict[str, Any]) -> dict[str, Any]:
    """A finding but for which occurrence it is (its ops' numbers, its count)."""
    sides = {side: {k: v for k, v in finding[side].items() if k != "seq"}
             for side in ("first", "second")}
    return {**{k: v for k, v in finding.items() if k != "count"}, **sides}


def test_a_trace_over_its_size_begins_anew_and_keeps_the_parts_that_raced(tmp_path):
    (tmp_path / "whole").mkdir()
    whole = _run(tmp_path / "whole", {30, 31, 250}, 400, 0)
    assert whole.parts_kept == [] and whole.parts_dropped == 0
    [online] = [f.to_json() for f in whole.findings]
    assert online["count"] == 3

    (tmp_path / "parts").mkdir()
    parts = _run(tmp_path / "parts", {30, 31, 250}, 400, 16_000)
    assert [f.to_json() for f in parts.findings] == [online]  # the same analysis online
    # The races of steps 30-31 and of step 250 are in two parts, kept; the rest are gone.
    assert len(parts.parts_kept) == 2 and parts.parts_dropped > 5
    files = sorted(p.name for p in (tmp_path / "parts").iterdir())
    assert files == sorted(["trace.jsonl", *(p.name for p in parts.parts_kept)])
    # Each part is a trace of its own, checked alone: it finds its races, with their bytes
    # named by the tensor that lived through the parts before it.
    counts = []
    for part in parts.parts_kept:
        [found] = _checked(part)
        counts.append(found["count"])
        assert _where(found) == _where(online)
    assert sorted(counts) == [1, 2]
    current = load_trace(tmp_path / "parts" / "trace.jsonl")
    assert current.header["part"] > 10 and _checked(tmp_path / "parts" / "trace.jsonl") == []
    assert {"type": "label", "buffer": 1, "offset": 0x20000, "length": 8192,
            "name": "tensor float32[2048] made at serve.py:0"} in current.records
    assert all(p.stat().st_size < 3 * 16_000 for p in (tmp_path / "parts").iterdir())


def test_only_the_first_parts_that_raced_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(A, "PARTS_KEPT", 2)
    parts = _run(tmp_path, set(range(0, 400, 20)), 400, 16_000)
    assert len(parts.parts_kept) == 2
    assert parts.findings[0].count == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        sorted(["trace.jsonl", *(p.name for p in parts.parts_kept)])


def test_a_capture_file_read_already_is_given_back_and_read_around(tmp_path):
    """The watch gives the disk back the events it analysed: a hole punched in place, where a
    reader from the start finds zeros and goes on at the line after them."""
    from harness.capture.events import Sink, give_back, iter_file, read_events
    path = tmp_path / "events.jsonl"
    sink = Sink.to_path(path)
    for i in range(20_000):
        sink.emit(["sync_stream", 0, f"serve.py:{i}"])
    sink.flush()
    events, offset = read_events(path, 0, limit=200_000)
    assert 0 < len(events) < 20_000
    held = path.stat().st_blocks
    if not give_back(path, offset):
        pytest.skip("this file system has no holes")
    assert path.stat().st_blocks < held
    with open(path, "rb") as f:
        assert f.read(offset) == b"\0" * offset  # what the disk took back reads as zeros
    sink.emit(["sync_stream", 0, "serve.py:20000"])  # the program appends on
    sink.close()
    after = list(iter_file(path))
    assert after[0] == ["sync_stream", 0, f"serve.py:{len(events)}"]
    assert len(events) + len(after) == 20_001
    assert read_events(path, offset)[0][0] == after[0]  # the watch's own offset is unchanged


def test_a_reader_from_the_start_passes_a_hole_in_one_step(tmp_path):
    """A file whose first gigabytes went back to the disk (a soak's events, read from the
    start by `gpurace minimize`): the reader goes on where the data begins, not 4 MiB of
    zeros at a time."""
    from harness.capture.events import read_events
    path = tmp_path / "events.jsonl"
    hole = 256 << 20
    with open(path, "wb") as f:
        f.seek(hole)  # never written: a hole, as give_back leaves one
        f.write(b'["sync_stream",0,"serve.py:1"]\n')
    if path.stat().st_blocks * 512 >= hole:
        pytest.skip("this file system has no holes")
    events, offset = read_events(path, 0)
    assert events == [] and offset == hole
    assert read_events(path, offset) == ([["sync_stream", 0, "serve.py:1"]], path.stat().st_size)
