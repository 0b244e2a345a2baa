"""`--executor ray` on a local Ray instance and the simulated device: the same run document as
a local run, a worker lost mid-trial is a crash and the run goes on, a hang is killed, and what
cannot run says so."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.targets import resolve_targets
from programs import hang_file

pytest.importorskip("ray")

def _run(out: Path, *args: str) -> dict:
    result = CliRunner().invoke(main, ["run", "smoke", "cudf-22284", "--backend", "sim",
                                       "--trials", "6", "--no-amplify", "--format", "json",
                                       "--out", str(out), *args])
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_a_ray_run_is_a_local_run(tmp_path: Path) -> None:
    local = _run(tmp_path / "local")
    on_ray = _run(tmp_path / "ray", "--executor", "ray", "--gpus", "2")
    assert on_ray["lanes"] == ["ray 0", "ray 1"] and on_ray["exit_code"] == local["exit_code"]
    for a, b in zip(local["results"], on_ray["results"], strict=True):
        for key in ("scenario", "variant", "status", "trials", "outcomes", "detected", "digest"):
            assert a[key] == b[key], (a["scenario"], a["variant"], key)
    # The incidents were written from the actors' traces, as a local run's are.
    incidents = [Path(p) for r in on_ray["results"] for p in r["reports"]]
    assert incidents and all((p / "report.json").exists() for p in incidents)


def _actor_running_a_trial() -> int | None:
    """The pid of a Ray actor process in the middle of a trial (Ray titles it by method)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"ray::_Actor.run" in cmdline:
                return int(entry.name)
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the actor in /proc")
def test_an_actor_lost_mid_trial_is_a_crash_and_the_run_goes_on(tmp_path: Path) -> None:
    path = hang_file(tmp_path)
    runner = Runner(RunOptions(backend="sim", executor="ray", timeout_s=6, out_dir=tmp_path))
    done: list = []
    thread = threading.Thread(target=lambda: done.append(
        runner.run(resolve_targets([str(path)], ()))))
    thread.start()
    deadline, pid = time.monotonic() + 60, None
    while pid is None and time.monotonic() < deadline:
        pid = _actor_running_a_trial()
        time.sleep(0.1)
    assert pid is not None, "no actor ran a trial"
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    thread.join(120)
    [r] = done[0].results
    # The first trial's actor was killed (a crash, which Ray reports as lost); the watchdog
    # ended the other two, each a hang, on the spares that took over.
    assert r.counts["crash"] == 1 and r.counts["hang"] == 2, r.counts
    first = r.first_manifested
    assert first is not None and first.index == 0 and "was lost" in first.detail
    assert len(r.restart_s) == 2


def test_without_ray_or_with_a_stray_address_it_says_what_to_do(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import harness.run.rayexec

    result = CliRunner().invoke(main, ["run", "smoke", "--backend", "sim", "--address", "auto",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--executor ray" in result.stderr
    monkeypatch.setattr(harness.run.rayexec, "_RAY", None)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    result = CliRunner().invoke(main, ["run", "smoke", "--backend", "sim", "--executor", "ray",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 2 and "gpurace[ray]" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
