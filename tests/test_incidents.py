"""Incidents on the simulated device: the same files as on a GPU, the reproduce command, JUnit,
doctor, `report list|show`, GPU-fatal Xids stopping a run, and SIGKILL mid-run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness.run.runner
from harness.cli import main
from harness.gpu.nvml import XidEvent
from harness.lang.targets import SCENARIO_ROOT
from harness.gpu.watch import FatalXid, GpuWatch, TrialXids
from harness.run.outputs import sweep_dead_runs
from reports import list_incidents, load_report

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", *args, "--format", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def crash_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("crash")
    code, doc = _run("catalog-reactivation", "--dangerous", "--backend", "sim", "--variant",
                     "buggy", "--trials", "5", "--seed", "7", "--out", str(out))
    assert code == 0
    return out, doc


def test_sim_crash_leaves_incident_folders(crash_run: tuple[Path, dict]) -> None:
    out, doc = crash_run
    [result] = doc["results"]
    assert len(result["reports"]) == 3  # --max-incidents default; 5 crashes counted
    for path in result["reports"]:
        folder = Path(path)
        assert folder.parent == out / doc["run_id"] == Path(doc["folder"])
        assert {"report.json", "report.md", "trace.jsonl"} <= {p.name for p in folder.iterdir()}
        report = load_report(folder)
        assert report["schema"] == "gpurace.report/1"
        assert report["outcome"] == "crash" and report["cuda_error"] == "CUDA_ERROR_ASSERT"
        assert report["xids"] == [] and "no GPU" in report["xid_note"]
        assert report["last_ops"][-1]["kind"] == "kernel:read_table"
        assert report["last_ops"][-1]["step"] == "request 1 decode"
        assert report["amplification"] == {"stream": "legacy", "before": "activate",
                                           "delay_us": 1000.0}
        assert "--trial" in report["reproduce"]["command"]
        markdown = (folder / "report.md").read_text()
        assert "CUDA_ERROR_ASSERT" in markdown and report["reproduce"]["command"] in markdown
        header = json.loads((folder / "trace.jsonl").read_text().splitlines()[0])
        assert header["schema"] == "gpurace.trace/1" and header["trial"] == report["trial"][
            "index"]


def test_reproduce_command_crashes_the_same_way(crash_run: tuple[Path, dict],
                                               tmp_path: Path) -> None:
    _, doc = crash_run
    report = load_report(Path(doc["results"][0]["reports"][1]))
    argv = shlex.split(report["reproduce"]["command"])
    assert argv[:2] == ["gpurace", "run"]
    code, again = _run(*argv[2:], "--out", str(tmp_path))
    [result] = again["results"]
    first = result["first_manifested"]
    assert result["trials"] == 1 and code == 0
    assert first["index"] == report["trial"]["index"] and first["seed"] == report["trial"]["seed"]
    assert first["cuda_error"] == "CUDA_ERROR_ASSERT"
    assert first["detail"] == report["detail"]


def test_hang_incident_keeps_the_ops_before_the_wait(tmp_path: Path) -> None:
    hang = tmp_path / "hang.yaml"
    hang.write_text(
        "apiVersion: gpurace/v1\nkind: Scenario\n"
        "metadata: {name: hang}\n"
        "spec:\n  pool: {pages: 2}\n  trials: 1\n  timeout: 1\n"
        "  variants: {fixed: {expect: clean}}\n"
        "  steps:\n    - {id: page, op: materialize, pages: 1}\n"
        "    - {id: stuck, op: delay, stream: compute, us: .inf}\n"
        "    - {id: wait, op: synchronize}\n")
    code, doc = _run(str(hang), "--backend", "sim", "--out", str(tmp_path / "out"))
    report = load_report(Path(doc["results"][0]["reports"][0]))
    assert code == 1 and report["outcome"] == "hang"
    assert report["last_ops"][-1]["kind"] == "kernel:delay"
    assert report["last_ops"][-1]["step"] == "stuck"


def test_junit_from_a_run(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    code, _ = _run(str(SCENARIO_ROOT / "release_fence.yaml"),
                   str(SCENARIO_ROOT / "cross_stream_race.yaml"), "--backend", "sim",
                   "--trials", "10", "--no-amplify", "--no-detect", "--junit", str(junit),
                   "--out", str(tmp_path / "out"))
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["release-fence", "cross-stream-race"]
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    # Unamplified, each race hid: a failure. cross-stream-race is dangerous, and runs all the
    # same: the simulated device has no CUDA context to crash.
    for scenario in ("release-fence", "cross-stream-race"):
        assert cases[(f"gpurace.{scenario}", "buggy")].find("failure") is not None
        assert cases[(f"gpurace.{scenario}", "fixed")].find("failure") is None
    assert root.get("failures") == "2" and code == 1
    assert [s.get("skipped") for s in suites] == ["0", "0"]


def test_doctor_without_gpu_explains_and_exits_0() -> None:
    result = CliRunner().invoke(main, ["doctor", "--format", "json"])
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["simulated device"]["ok"]
    if not checks["CUDA device"]["ok"]:
        assert any("cuda backend: not usable here" in v for v in report["verdict"])
        assert any(v.startswith("sim backend: usable") for v in report["verdict"])
    text = CliRunner().invoke(main, ["doctor"])
    assert text.exit_code == 0 and "sim backend" in text.output


def test_doctor_fails_a_gpu_that_needs_a_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on an H200 whose GSP stopped answering: NVML still lists it, CUDA no longer shows
    it, and every health query says "GPU requires restart". Doctor must not call it healthy."""
    import kvcore
    from harness.gpu import doctor

    monkeypatch.setattr(kvcore, "cuda_available", lambda: (True, "1 CUDA device(s)"))
    monkeypatch.setattr(doctor, "_cuda_count", lambda: 1)
    monkeypatch.setattr(doctor, "nvml_summary", lambda: {
        "available": True, "devices": [], "xid_events": "supported", "device_count": 2})
    monkeypatch.setattr(doctor, "visible_gpus", lambda: [0, 1])
    monkeypatch.setattr(doctor, "other_gpu_processes", lambda: ([], ""))
    monkeypatch.setattr(doctor, "health_snapshot", lambda index: {
        "available": True, "uuid": f"GPU-{index}", "temperature_c": 35,
        "needs_reset": "the driver says the GPU requires a reset" if index == 0 else ""})
    checks = {c["name"]: c for c in doctor.diagnose()["checks"]}
    assert not checks["GPU 0 health (GPU-0)"]["ok"]
    assert checks["GPU 0 health (GPU-0)"]["detail"].startswith("needs a reset: the driver")
    assert checks["GPU 1 health (GPU-1)"]["ok"]
    assert not checks["CUDA sees every GPU"]["ok"]
    assert "CUDA shows 1 of the 2 GPUs" in checks["CUDA sees every GPU"]["detail"]


def test_report_list_and_show(crash_run: tuple[Path, dict]) -> None:
    out, doc = crash_run
    listed = CliRunner().invoke(main, ["report", "list", str(out), "--format", "json"])
    items = json.loads(listed.stdout)
    assert sorted(i["path"] for i in items) == sorted(doc["results"][0]["reports"])
    shown = CliRunner().invoke(main, ["report", "show", items[0]["path"]])
    assert shown.exit_code == 0 and "# gpurace incident: catalog-reactivation" in shown.output
    missing = CliRunner().invoke(main, ["report", "list", str(out / "nope")])
    assert missing.exit_code == 2 and "Traceback" not in missing.output


class _FatalWatch(GpuWatch):
    """A watch whose GPU reports Xid 79 as soon as the first trial ends."""

    def __init__(self, backend: str, on_gap=None) -> None:
        super().__init__("sim", on_gap)
        self.notes = []
        self.ended = False

    def for_trial(self, pid: int | None, t0: float, crashed: bool,
                  gpu: str | None = None) -> TrialXids:
        self.ended = True  # the first (buggy, amplified) trial went wrong: its Xids are asked
        return TrialXids()

    def fatal_since(self, t0: float) -> list[FatalXid]:
        return [FatalXid(79, "GPU has fallen off the bus", "GPU-fake", None, "nvml")
                ] if self.ended else []


def test_gpu_fatal_xid_stops_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(harness.run.runner, "GpuWatch", _FatalWatch)
    code, doc = _run(str(SCENARIO_ROOT / "release_fence.yaml"), "--backend", "sim",
                     "--trials", "50", "--out", str(tmp_path))
    assert code == 1
    assert "Xid 79" in doc["stopped"] and "needs attention" in doc["stopped"]
    assert sum(r["trials"] for r in doc["results"]) == 1  # nothing ran after the fatal Xid


def test_sigkill_mid_run_leaves_no_half_written_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "harness.cli", "run", "catalog-reactivation", "--dangerous",
           "--backend", "sim", "--variant", "buggy", "--trials", "2000", "--max-incidents",
           "2000", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if out.exists() and len([p for p in out.glob("run-*/2*")]) >= 5:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # the harness itself, mid-run
        proc.wait(10)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # and its orphaned worker
        except ProcessLookupError:
            pass
    [run] = out.glob("run-*")
    incidents = [p for p in run.iterdir() if p.is_dir() and not p.name.startswith(".")
                 and p.name != "workers"]
    assert len(incidents) >= 5
    for folder in incidents:
        report = load_report(folder)  # complete JSON with the right schema
        for name in report["files"]:
            assert (folder / name).stat().st_size > 0
    assert not (run / "run.json").exists()  # never half-written: it is written at the end
    assert all("error" not in item for item in list_incidents(out))
    assert sweep_dead_runs(out) >= 0  # the killed run's folder: its owner is dead
    assert not [p for p in out.rglob(".*.tmp")]


class _FakeNvml:
    def __init__(self, events: list[XidEvent]) -> None:
        self.events = events

    def events_since(self, t0: float) -> list[XidEvent]:
        return [e for e in self.events if e.monotonic_time >= t0]


def test_watch_attributes_xids_by_time_and_pid() -> None:
    from harness.gpu.kernlog import KernelLog

    lines = ["[1.0] unrelated"]
    klog = KernelLog(read_lines=lambda: list(lines))
    klog.start()
    watch = GpuWatch("sim")
    watch.backend, watch.notes = "cuda", []
    # The wall clock stepped back an hour between the two (NTP, a VM resumed): attribution
    # goes by the monotonic clock, which a step leaves alone.
    now = time.monotonic()
    watch.nvml = _FakeNvml([XidEvent(43, 0, "GPU-x", "xid", time.time() - 3600, now),
                            XidEvent(13, 0, "GPU-x", "xid", time.time(), now - 60)])
    watch.klog = klog
    lines += ["NVRM: Xid (PCI:0000:00:06): 43, pid=516, name=python3, channel 0x0000000a",
              "NVRM: Xid (PCI:0000:00:06): 31, pid=999, name=python3, channel 0x0000000a"]
    said = watch.for_trial(516, now - 1, crashed=True)
    assert [x["xid"] for x in said.xids] == [43]  # Xid 13 came before, 31 from another pid
    [xid] = said.xids
    assert xid["class"] == "application" and xid["sources"] == ["nvml", "kernel-log"]
    assert "pid=516" in xid["line"] and said.kernel_log == [lines[1]]
    assert not said.fatal
    empty = watch.for_trial(516, now + 10, crashed=False)
    assert empty.xids == [] and "no Xid was reported" in empty.note


def test_watch_gives_a_gpu_only_its_own_nvml_xids() -> None:
    """On a run of several GPUs, an NVML event of GPU-y is not a GPU-x trial's; one that names
    no GPU could be anyone's."""
    watch = GpuWatch("sim")
    watch.backend, watch.notes, watch.klog = "cuda", [], None
    now = time.monotonic()
    watch.nvml = _FakeNvml([XidEvent(43, 1, "GPU-y", "xid", time.time(), now),
                            XidEvent(31, None, None, "xid", time.time(), now)])
    assert [x["xid"] for x in watch.for_trial(516, now - 1, False, gpu="GPU-x").xids] == [31]
    assert [x["xid"] for x in watch.for_trial(516, now - 1, False, gpu="GPU-y").xids] == [43, 31]
    assert [x["xid"] for x in watch.for_trial(516, now - 1, False).xids] == [43, 31]


def test_doctor_says_which_frameworks_watch_sees_in_this_interpreter() -> None:
    """One row a source (PyTorch, CuPy, Triton): whether its framework imports here, with its
    version; and a verdict line naming those watch sees."""
    import importlib.util

    report = json.loads(CliRunner().invoke(main, ["doctor", "--format", "json"]).stdout)
    checks = {c["name"]: c for c in report["checks"]}
    (line,) = [v for v in report["verdict"] if v.startswith("watch: ")]
    for title, module in (("PyTorch", "torch"), ("CuPy", "cupy"), ("Triton", "triton")):
        check = checks[f"watch: {title}"]
        if importlib.util.find_spec(module) is None:
            assert not check["ok"] and "does not import" in check["detail"]
            assert title not in line.split(";")[0]
        elif check["ok"]:
            assert check["detail"].startswith(title) and title in line.split(";")[0]
    assert "run.json names the sources that watched it" in line
