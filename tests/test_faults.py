"""Faults of the machine, not of the input (#34): here, an output whose reader went away.

`gpurace run zoo ... | head -2` went on to the end and exited 1 with no word, as if an
expectation had failed (click's answer to a closed pipe). Now a command whose standard output
is closed goes on to its own end, writes its files, and exits with its own code, quietly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INCIDENT_TRACE = ROOT / "tests" / "capture_recorded" / "torch_record_stream-buggy.jsonl"


def _closed_stdout(*args: str, cwd: Path) -> tuple[int, str]:
    """Run gpurace with its standard output a pipe nobody reads (closed before it writes)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write is a broken pipe
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *args], stdout=write,
                            stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(write)
    _, stderr = proc.communicate(timeout=300)
    return proc.returncode, stderr


@pytest.mark.parametrize("args, code", [
    (["run", "release-fence", "--backend", "sim", "--trials", "2"], 0),
    (["run", "release-fence", "--backend", "sim", "--trials", "2", "--format", "json"], 0),
    (["explore", "release-fence", "--strategy", "pct", "--runs", "20"], 0),
    (["list"], 0),
    (["list", "--format", "json"], 0),
], ids=["run", "run-json", "explore", "list", "list-json"])
def test_a_closed_output_ends_with_the_commands_own_code_quietly(tmp_path, args, code):
    if args[0] == "run":
        args = [*args, "--out", str(tmp_path / "out")]
    got, stderr = _closed_stdout(*args, cwd=tmp_path)
    assert got == code, stderr[-2000:]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    if args[0] == "run":  # the run's files are written all the same
        (doc,) = (tmp_path / "out").glob("run-*/run.json")
        assert '"exit_code": 0' in doc.read_text()


def test_check_into_a_closed_output_still_says_its_races_by_its_code(tmp_path):
    from harness.capture.analysis import RunAnalysis
    from harness.capture.events import iter_file
    trace = tmp_path / "trace.jsonl"
    analysis = RunAnalysis(trace, {"scenario": "torch_record_stream", "variant": "watched"})
    analysis.feed(list(iter_file(INCIDENT_TRACE)))
    analysis.close()
    got, stderr = _closed_stdout("check", str(trace), cwd=tmp_path)
    assert got == 1 and "Traceback" not in stderr  # 1: races found, as with an open output
