"""Warm spare workers: once a variant's workers start dying, the next one is already made and
waiting, so a death costs a hand-over; a spare that is not needed is stopped, never leaked."""

from __future__ import annotations

import multiprocessing
import os
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.results.hooks import RunHooks
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.scenario import load_scenario
from harness.lang.targets import SCENARIO_ROOT, resolve_targets
from harness.run.worker import WorkerJob
from harness.run.workers import WorkerSupply
from programs import hang_file

def _supplies(monkeypatch) -> list[WorkerSupply]:
    """Every worker supply the runner makes from now on, to ask after the run how its
    workers came (a start on sim takes milliseconds, so times cannot say)."""
    import harness.run.runner

    made: list[WorkerSupply] = []

    class Recorded(WorkerSupply):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(harness.run.runner, "WorkerSupply", Recorded)
    return made


def test_after_the_first_death_each_next_worker_is_a_warm_spare(tmp_path: Path,
                                                                monkeypatch) -> None:
    """Five hangs, each killed by the watchdog: the first death waits for a worker to start,
    the later ones take the spare that started while the trial hung."""
    supplies = _supplies(monkeypatch)
    runner = Runner(RunOptions(backend="sim", timeout_s=1.5, out_dir=tmp_path))
    [r] = runner.run(resolve_targets([str(hang_file(tmp_path, 5))])).results
    assert r.counts["hang"] == 5
    cold, *warm = r.restart_s
    assert len(warm) == 3
    # Workers: the first (started before the trials) and one started after the first death,
    # four spares after that death, one more for each of the three spares taken; the four
    # left waiting were stopped with the variant.
    [supply] = supplies
    assert supply.started == 2 + 4 + 3 and supply.warm == 1 + 3
    workers = sorted((Path(runner.out_dir) / "workers").iterdir())
    assert len(workers) == 2 + 4 + 3
    assert not multiprocessing.active_children()
    print(f"\nrestart after a worker's death: cold {cold * 1e3:.0f} ms, warm median "
          f"{statistics.median(warm) * 1e3:.2f} ms")


def test_a_run_without_deaths_starts_no_spare(tmp_path: Path) -> None:
    runner = Runner(RunOptions(backend="sim", trials=3, out_dir=tmp_path))
    results = runner.run(resolve_targets(["smoke"])).results
    assert all(r.restart_s == [] for r in results)
    assert len(list((Path(runner.out_dir) / "workers").iterdir())) == len(results)
    assert not multiprocessing.active_children()


def test_a_spare_that_died_waiting_is_replaced(tmp_path: Path) -> None:
    scenario = load_scenario(hang_file(tmp_path, 5))
    made = []

    def make_job() -> WorkerJob:
        folder = tmp_path / f"w{len(made)}"
        made.append(folder)
        return WorkerJob(scenario, "fixed", "sim", os.getpid(), False, None,
                         str(folder / "worker.log"), str(folder), {})

    supply = WorkerSupply(make_job, 60.0, spares=1)
    supply.died()
    first = supply.take()
    supply.refill()  # a spare behind it
    [spare] = supply.waiting
    assert first.pid != spare.pid
    spare.proc.kill()
    spare.proc.join(5)
    second = supply.take()
    assert second.pid not in (first.pid, spare.pid) and supply.warm == 0
    supply.refill()
    assert supply.started == 4  # first, its spare, the replacement and its own spare
    waiting = supply.waiting[0].pid
    third = supply.take()
    assert third.pid == waiting and supply.warm == 1
    for worker in (first, second, third):
        worker.stop()
    supply.close()
    assert not multiprocessing.active_children()


def test_without_spares_every_death_waits_for_a_start(tmp_path: Path, monkeypatch) -> None:
    supplies = _supplies(monkeypatch)
    runner = Runner(RunOptions(backend="sim", timeout_s=1.0, trials=3, spares=0,
                               out_dir=tmp_path))
    [r] = runner.run(resolve_targets([str(hang_file(tmp_path, 5))])).results
    assert r.counts["hang"] == 3 and len(r.restart_s) == 2
    # Each death: a worker started then (only the first was started ahead, for the trials).
    [supply] = supplies
    assert supply.started == 3 and supply.warm == 1
    assert len(list((Path(runner.out_dir) / "workers").iterdir())) == 3


def test_spares_are_kept_and_all_stop(tmp_path: Path) -> None:
    scenario = load_scenario(hang_file(tmp_path, 5))
    supply = WorkerSupply(lambda: WorkerJob(scenario, "fixed", "sim", os.getpid(), False, None,
                                            str(tmp_path / "w.log"), str(tmp_path), {}),
                          60.0, spares=3)
    supply.refill()
    assert supply.waiting == []  # no death yet: no spare
    supply.died()
    taken = []
    for _ in range(4):
        taken.append(supply.take())
        supply.refill()
        assert len(supply.waiting) == 3
    assert supply.warm == 3  # the 2nd, 3rd and 4th were spares
    assert supply.started == 1 + 3 + 3  # the first, three spares, one more for each taken
    for worker in taken:
        worker.stop()
    supply.close()
    assert supply.waiting == [] and not multiprocessing.active_children()


# -- lanes: several devices side by side ------------------------------------------------------

def test_three_simulated_devices_make_the_same_trials_as_one(tmp_path: Path) -> None:
    """The trials a run makes do not depend on how many lanes made them: same counts, same
    per-trial digest; and every lane did some of them."""
    def run(gpus: str | None) -> tuple[list, Runner]:
        runner = Runner(RunOptions(backend="sim", trials=12, amplify=False, gpus=gpus,
                                   out_dir=tmp_path / str(gpus)))
        return runner.run(resolve_targets(["smoke", "cudf-22284"], ())).results, runner

    one, _ = run(None)
    three, runner = run("3")
    assert [(r.digest, r.outcomes(), r.detected) for r in one] == \
        [(r.digest, r.outcomes(), r.detected) for r in three]
    assert any(0 < r.detected < r.trials for r in one)
    assert [name for name, _ in runner.lanes] == ["sim 0", "sim 1", "sim 2"]
    # Each variant's trials went to three workers, one a lane.
    assert len(list((Path(runner.out_dir) / "workers").iterdir())) == 3 * len(three)
    assert not multiprocessing.active_children()


def test_lanes_survive_hangs_and_hand_each_death_to_a_spare(tmp_path: Path) -> None:
    runner = Runner(RunOptions(backend="sim", timeout_s=1.0, trials=6, gpus="2",
                               out_dir=tmp_path))
    [r] = runner.run(resolve_targets([str(hang_file(tmp_path, 5))])).results
    assert r.counts["hang"] == 6 and r.trials == 6
    assert r.first_manifested is not None and r.first_manifested.index == 0
    assert len(r.restart_s) >= 4  # one per death that had trials left after it
    assert not multiprocessing.active_children()


def test_a_lane_whose_worker_is_slow_to_start_holds_up_no_other(tmp_path: Path,
                                                               monkeypatch) -> None:
    """Nothing in a run waits for one lane: while GPU 0's worker has not said it is ready,
    the other lane runs every trial (a worker start used to hold the whole run, so a crash
    soak ran no faster on two GPUs than on one). The worker that never got ready is stopped
    with the run."""
    import harness.run.runner
    from harness.run.workers import Worker

    real = Runner._start_worker
    started: list[Worker] = []
    silent = []  # the starting worker's end of its pipe: open (it lives), never written

    class Starting:  # a process that has not said it is ready (and will not in this run)
        pid = None
        killed = False

        def is_alive(self) -> bool:
            return not self.killed

        def kill(self) -> None:
            self.killed = True

        def join(self, timeout: float | None = None) -> None:
            pass

    def start(self: Runner, job: WorkerJob) -> Worker:
        if started:
            worker = real(self, job)
        else:
            ours, theirs = multiprocessing.Pipe()
            worker = Worker(Starting(), ours, job)  # type: ignore[arg-type]
            silent.append(theirs)
        started.append(worker)
        return worker

    monkeypatch.setattr(Runner, "_start_worker", start)
    # A run that waited for it would fail at its start timeout: soon, not in two minutes.
    monkeypatch.setattr(harness.run.runner, "WORKER_START_TIMEOUT_S", 15.0)
    runner = Runner(RunOptions(backend="sim", gpus="2", trials=40, variants=("fixed",),
                               dangerous=True, out_dir=tmp_path))
    [r] = runner.run(resolve_targets(["cross-stream-race"])).results
    assert r.trials == 40 and r.counts["clean"] == 40
    assert len(started) == 2 and started[0].proc.killed  # type: ignore[attr-defined]
    assert not multiprocessing.active_children()


def test_a_fatal_xid_retires_its_gpu_and_the_others_go_on(tmp_path: Path) -> None:
    from collections import deque

    from harness.gpu.watch import FatalXid
    from harness.run.lanes import Lane

    runner = Runner(RunOptions(backend="sim", out_dir=tmp_path))

    class Watch:
        events: list[FatalXid] = []

        def fatal_since(self, t0: float) -> list[FatalXid]:
            return self.events

    runner.watch, runner.started = Watch(), 0.0  # type: ignore[assignment]
    supply = WorkerSupply(lambda: None, 1.0)  # type: ignore[arg-type,return-value]
    lanes = [Lane("GPU 0", supply, device={"uuid": "GPU-a", "pci_bus_id": "0000:00:06"}),
             Lane("GPU 1", supply, device={"uuid": "GPU-b", "pci_bus_id": "0000:00:07"}),
             Lane("GPU 2", supply, device={"uuid": "GPU-c", "pci_bus_id": "0000:00:08"})]
    lanes[1].inflight = deque([(4, 44), (5, 55)])
    queue: deque = deque([(6, 66)])
    runner._retire_lanes(lanes, queue)
    assert runner.retired == {} and not runner.stopped
    Watch.events = [FatalXid(79, "fallen off the bus", "GPU-b", None, "nvml")]
    runner._retire_lanes(lanes, queue)
    assert list(runner.retired) == ["GPU 1"] and "Xid 79" in runner.retired["GPU 1"]
    assert list(queue) == [(4, 44), (5, 55), (6, 66)] and not lanes[1].inflight
    assert not lanes[0].retired and not runner.stopped  # GPU 0 goes on
    # The kernel log names a GPU by its PCI address (seen: Xid 119, a GSP timeout, on an H200
    # whose NVML events had stopped); another GPU of the host printing there is not ours.
    Watch.events = [FatalXid(119, "GSP RPC timeout", None, "0000:00:09", "kernel-log"),
                    FatalXid(119, "GSP RPC timeout", None, "00000000:00:08.0", "kernel-log")]
    runner._retire_lanes(lanes, queue)
    assert list(runner.retired) == ["GPU 1", "GPU 2"] and "Xid 119" in runner.retired["GPU 2"]
    assert not lanes[0].retired and not runner.stopped
    # A fatal NVML Xid that names no GPU cannot be placed: every GPU stops.
    Watch.events = [FatalXid(48, "double-bit ECC error", None, None, "nvml")]
    runner._retire_lanes(lanes, queue)
    assert lanes[0].retired and "the run stopped here" in runner.stopped


def test_the_kernel_log_says_a_gpu_is_gone_even_when_nvml_does_not(monkeypatch) -> None:
    from harness.gpu import watch as watchmod
    from harness.gpu.kernlog import parse_xid_line

    lines = [parse_xid_line("NVRM: Xid (PCI:0000:00:06): 43, pid=7, name=python3, Ch 8"),
             parse_xid_line("NVRM: Xid (PCI:0000:00:06): 119, pid=15854, name=python3, "
                            "Timeout after 45s of waiting for RPC response from GPU1 GSP!")]

    class Log:
        available = True

        def poll(self) -> list:
            out, lines[:] = list(lines), []
            return out

    gpu = watchmod.GpuWatch("sim")
    gpu.backend, gpu.klog = "cuda", Log()  # type: ignore[assignment]  # no NVML: it is silent
    # The trial of pid 15854 takes its line for its report; the run still sees the GPU is gone.
    assert [x["xid"] for x in gpu.for_trial(15854, 0.0, crashed=False).xids] == [119]
    [fatal] = gpu.fatal_since(0.0)
    assert (fatal.xid, fatal.pci, fatal.source) == (119, "0000:00:06", "kernel-log")
    assert watchmod.same_pci("0000:00:06", "00000000:00:06.0")
    assert not watchmod.same_pci("0000:00:06", "0000:00:07") and not watchmod.same_pci(None, None)


def test_gpus_name_the_gpus_this_process_sees(monkeypatch, tmp_path: Path) -> None:
    import harness.run.runner
    from harness.errors import TargetError

    runner = Runner(RunOptions(backend="sim", out_dir=tmp_path))
    runner.backend = "cuda"
    # Workers are pinned by UUID: CUDA's ordinals skip a GPU it cannot use.
    monkeypatch.setattr(harness.run.runner, "gpu_uuids", lambda: ["GPU-a", "GPU-b"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert runner._resolve_lanes("all") == [("GPU 0", "GPU-a"), ("GPU 1", "GPU-b")]
    assert runner._resolve_lanes("1") == [("GPU 0", "GPU-a")]
    assert runner._resolve_lanes(None) == [("GPU 0", None)]
    # Without UUIDs, the parent's own entry for each GPU.
    monkeypatch.setattr(harness.run.runner, "gpu_uuids", lambda: [None, None])
    assert runner._resolve_lanes("all") == [("GPU 0", "3"), ("GPU 1", "5")]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert runner._resolve_lanes("1,0") == [("GPU 1", "1"), ("GPU 0", "0")]
    try:
        runner._resolve_lanes("0,2")
    except TargetError as exc:
        assert "sees 2 GPU(s)" in str(exc)
    else:
        raise AssertionError("GPU 2 of 2 was accepted")


class _Health:
    """A run's GPU watch, as far as retiring GPUs asks it: health by UUID."""

    def __init__(self, broken: dict[str, str]) -> None:
        self.broken = broken
        self.asked: list[str | None] = []

    def health(self, gpu: str | None = None) -> dict:
        self.asked.append(gpu)
        return {"available": True, "index": "abc".index(gpu[-1]) if gpu else 0,
                "needs_reset": self.broken.get(gpu or "", "")}

    def fatal_since(self, t0: float) -> list:
        return []


def test_an_incident_on_one_of_several_gpus_reproduces_on_that_gpu(tmp_path: Path) -> None:
    """A pinned lane's incident: its reproduce command runs under the lane's
    CUDA_VISIBLE_DEVICES (a fault of that GPU would not show on another), said in report.json,
    report.md and report.html; an unpinned lane's command is the bare one."""
    import functools
    import shlex

    from harness.gpu.watch import TrialXids
    from harness.run.incidents import reproduce_argv
    from harness.results.outcome import Outcome, TrialResult
    from reports import load_report

    runner = Runner(RunOptions(backend="sim", out_dir=tmp_path))
    runner.backend = "cuda"
    runner.folder = SimpleNamespace(path=tmp_path)  # type: ignore[assignment]
    runner.watch = SimpleNamespace(health=lambda gpu=None: None)  # type: ignore[assignment]
    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    variant = scenario.variant("buggy")
    run = SimpleNamespace(scenario=scenario, variant=variant, amplification=None,
                          argv=functools.partial(
                              reproduce_argv, scenario, variant, backend="cuda", run_seed=7,
                              amplified=False, delay_us=None, delay_overridden=False,
                              timeout_s=None))
    trial = TrialResult(3, 11, Outcome.CORRUPTION, detail="page 1 held 0xab")
    reports = {}
    for gpu in ("GPU-4f1c9a2e", None):
        job = SimpleNamespace(log_path=str(tmp_path / "none.log"), gpu=gpu)
        folder = runner._incident(run, trial, TrialXids(), job, {})  # type: ignore[arg-type]
        reports[gpu] = (load_report(folder), folder)
    pinned, folder = reports["GPU-4f1c9a2e"]
    command = pinned["reproduce"]["command"]
    assert pinned["reproduce"]["env"] == {"CUDA_VISIBLE_DEVICES": "GPU-4f1c9a2e"}
    assert command.startswith("CUDA_VISIBLE_DEVICES=GPU-4f1c9a2e gpurace run ")
    # The shell reads the assignment, then exactly the argv.
    assert shlex.split(command) == ["CUDA_VISIBLE_DEVICES=GPU-4f1c9a2e", *pinned["reproduce"][
        "argv"]]
    assert command in (folder / "report.md").read_text()
    assert "CUDA_VISIBLE_DEVICES=" in (folder / "report.html").read_text()
    bare, _ = reports[None]
    assert "env" not in bare["reproduce"]
    assert bare["reproduce"]["command"] == shlex.join(bare["reproduce"]["argv"])
    assert bare["reproduce"]["argv"] == pinned["reproduce"]["argv"]
    jsonschema = pytest.importorskip("jsonschema")
    from harness import schemas
    for report, _ in reports.values():
        jsonschema.validate(report, schemas.load("report"))


def test_a_gpu_that_needs_a_reset_runs_nothing(monkeypatch, tmp_path: Path) -> None:
    """Before any trial, a GPU the driver wants reset is retired (the run exits 1); with
    --gpus all, one that CUDA no longer shows is named too, not silently left out."""
    import harness.run.runner

    monkeypatch.setattr(harness.run.runner, "gpu_uuids", lambda: ["GPU-a", "GPU-b"])
    monkeypatch.setattr(harness.run.runner, "cuda_state", lambda: (
        True, "2 CUDA device(s)", ["GPU-a", "GPU-b"], ["GPU-a", "GPU-b", "GPU-c"]))
    runner = Runner(RunOptions(backend="sim", gpus="all", out_dir=tmp_path))
    runner.backend = "cuda"
    runner.lanes = runner._resolve_lanes("all")
    runner.watch = _Health({"GPU-b": "GSP stopped", "GPU-c": "requires a reset"})  # type: ignore
    runner._retire_unusable_gpus()
    assert list(runner.retired) == ["GPU 1", "NVML GPU 2"] and not runner.stopped
    assert runner.retired["GPU 1"].startswith("GPU 1 (GPU-b) cannot run: GSP stopped")
    assert "(GPU-c) cannot run: requires a reset" in runner.retired["NVML GPU 2"]
    # The default lane is CUDA's first GPU, by UUID: its health is that GPU's.
    assert runner._gpu_of(None) == "GPU-a"
    runner.retired.clear()
    runner.watch = _Health({"GPU-a": "x", "GPU-b": "y"})  # type: ignore
    runner._retire_unusable_gpus()
    assert runner.stopped.endswith("the run stopped here")
    assert "cannot run: CUDA does not show it" in runner.retired["NVML GPU 2"]
    # Without --gpus, the one lane's GPU is the one whose health the run took before it began:
    # that snapshot says, and NVML is not asked again.
    single = Runner(RunOptions(backend="sim", out_dir=tmp_path))
    single.backend, single.lanes = "cuda", [("GPU 0", None)]
    single.watch = _Health({})  # type: ignore[assignment]
    single.health = {"before": {"needs_reset": "the driver says the GPU requires a reset"}}
    single._retire_unusable_gpus()
    assert single.retired["GPU 0"].startswith("GPU 0 (GPU-a) cannot run: the driver says")
    assert single.watch.asked == [] and single.stopped  # type: ignore[attr-defined]


def test_a_worker_that_cannot_start_on_a_gpu_that_needs_a_reset_retires_its_lane(
        tmp_path: Path) -> None:
    from collections import deque

    from harness.errors import HarnessError
    from harness.run.lanes import Lane
    from harness.run.workers import WorkerFailed

    class Dead:
        proc = None
        job = SimpleNamespace(scenario=SimpleNamespace(path="smoke.yaml"), variant="buggy",
                              log_path="worker.log")

        def stop(self, timeout: float = 0.0) -> None:
            pass

    class Supply:
        def poll(self) -> None:
            raise WorkerFailed(Dead(), ("error", "cudaErrorDevicesUnavailable"))  # type: ignore

        def close(self) -> None:
            pass

    runner = Runner(RunOptions(backend="sim", out_dir=tmp_path))
    runner.backend = "cuda"
    runner.watch = _Health({"GPU-b": "the driver says the GPU requires a reset"})  # type: ignore
    lane = Lane("GPU 1", Supply(), pin="GPU-b")  # type: ignore[arg-type]
    queue: deque = deque([(5, 55), (6, 66), (7, 77)])
    assert not runner._ready_worker(lane, queue)
    assert lane.retired.startswith("GPU 1 (GPU-b) cannot start a worker: the driver says")
    assert list(queue) == [(5, 55), (6, 66), (7, 77)] and runner.retired
    runner._stop_if_all_retired([lane])
    assert runner.stopped.startswith("GPU 1 (GPU-b) cannot start a worker")
    # On a GPU that is well, a worker that cannot start is the error it always was.
    healthy = Lane("GPU 0", Supply(), pin="GPU-a")  # type: ignore[arg-type]
    with pytest.raises(HarnessError, match="cudaErrorDevicesUnavailable"):
        runner._ready_worker(healthy, queue)


def test_a_bad_gpus_value_is_a_usage_error(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from harness.cli import main

    for value in ("0", "x", "1,1", "65", "1,,2"):
        result = CliRunner().invoke(main, ["run", "smoke", "--backend", "sim", "--gpus", value,
                                           "--out", str(tmp_path)])
        assert result.exit_code == 2 and "--gpus" in result.stderr, value


def test_the_lanes_benchmark_runs_on_the_simulated_device(capsys) -> None:
    from harness import bench

    assert bench.main(["--gpus", "2", "--backend", "sim", "--trials", "6",
                       "--scenario", "release-fence", "--variant", "buggy"]) == 0
    out = capsys.readouterr().out
    assert "1 lane:" in out and "--gpus 2:" in out and "trial rate ratio:" in out


@pytest.mark.parametrize("record", [False, True])
def test_a_worker_keeps_only_the_traces_the_parent_can_use(tmp_path: Path,
                                                           record: bool) -> None:
    """Every unamplified trial of cross_stream_race's buggy variant races: the worker keeps
    the traces of its first ``traces_kept`` (the parent's incidents need no more), and with
    --record every trace."""
    from harness.lang.targets import SCENARIO_ROOT
    from harness.run.worker import TrialRunner

    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    job = WorkerJob(scenario, "buggy", "sim", os.getpid(), False, None,
                    str(tmp_path / "worker.log"), str(tmp_path), {}, record=record,
                    traces_kept=2)
    runner = TrialRunner(job)
    trials = [runner.run(i, i).trial() for i in range(5)]
    assert all(t.findings and t.race for t in trials)
    kept = [t.trace is not None for t in trials]
    assert kept == ([True] * 5 if record else [True, True, False, False, False])
    assert len(list(tmp_path.glob("trial-0*.jsonl"))) == sum(kept)


def test_each_trials_message_carries_its_findings_as_the_detector_built_them(tmp_path: Path
                                                                            ) -> None:
    """Reissued or step by step, every trial's message stands alone: its findings in full,
    the detector's own, and the parent's trial has them, each trial its own copy."""
    from harness.lang.targets import SCENARIO_ROOT
    from harness.run.worker import TrialRunner

    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    for reissue in (True, False):
        job = WorkerJob(scenario, "buggy", "sim", os.getpid(), False,
                        None, str(tmp_path / "worker.log"), str(tmp_path / str(reissue)), {},
                        reissue=reissue, keep_world=True)
        runner = TrialRunner(job)
        trials = []
        for i in range(8):
            message = runner.run(i, i)
            assert message.findings == runner.detector.findings_json(), (reissue, i)
            trials.append(message.trial())
            assert trials[-1].findings == message.findings and trials[-1].race
            assert trials[-1].findings[0]["first"]["seq"] > trials[0].findings[0]["first"][
                "seq"] or i == 0
        assert trials[0].findings[0]["first"] is not trials[1].findings[0]["first"]


def test_a_trials_message_is_the_trial_the_parent_keeps() -> None:
    """What a worker sends of a trial, read back: every field as the executor and the worker
    gave it, and a trial with no findings is no race."""
    import pickle

    from harness.results.outcome import Outcome, TrialResult
    from harness.run.wire import TrialMessage, trial_message

    result = TrialResult(4, 4, Outcome.CORRUPTION, "bad bytes", "cudaErrorAssert", "check", 3,
                         0.25, reissued=True)
    message = trial_message(result, 1, [], "t.jsonl", 9, ("t.jsonl", "ENOSPC"))
    again = pickle.loads(pickle.dumps(message))
    assert isinstance(again, TrialMessage) and again == message
    trial = again.trial()
    assert trial == TrialResult(4, 4, Outcome.CORRUPTION, "bad bytes", "cudaErrorAssert",
                                "check", 3, 0.25, worker_pid=1, trace="t.jsonl", ops_total=9,
                                reissued=True)
    assert not trial.race and again.trace_error == ("t.jsonl", "ENOSPC")


# -- a worker that outlives its variant --------------------------------------------------------

class _Pids(RunHooks):
    """Each trial's worker, by variant, in the order the trials ended."""

    def __init__(self) -> None:
        self.by_variant: dict[tuple[str, str], list[int | None]] = {}

    def trial_finished(self, result, trial) -> None:
        self.by_variant.setdefault((result.scenario, result.variant), []).append(
            trial.worker_pid)


def _digest(results) -> list[tuple]:
    return [(r.scenario, r.variant, r.status, r.manifested, r.detected, r.reissued,
             tuple(sorted(r.counts.items())),
             r.first_manifested.detail if r.first_manifested else None) for r in results]


def test_one_worker_runs_the_variants_one_after_another_and_they_end_as_alone(
        tmp_path: Path, monkeypatch) -> None:
    """A lane's worker is handed the next variant's job once its trials all ended: one
    process for the whole run, each variant with its own worker folder, and every variant's
    trials the same as when each variant had a worker of its own."""
    targets = ["smoke", "cudf-22284"]
    pids = _Pids()
    runner = Runner(RunOptions(backend="sim", trials=4, out_dir=tmp_path / "kept"), pids)
    kept = runner.run(resolve_targets(targets)).results
    assert len(kept) >= 4
    assert len({pid for got in pids.by_variant.values() for pid in got}) == 1
    assert len(list((Path(runner.out_dir) / "workers").iterdir())) == len(kept)
    assert not multiprocessing.active_children()  # the kept worker stopped with the run

    import harness.run.runner

    alone_pids = _Pids()
    monkeypatch.setattr(harness.run.runner.Runner, "_park", lambda self, lane: None)
    alone = Runner(RunOptions(backend="sim", trials=4, out_dir=tmp_path / "alone"),
                   alone_pids).run(resolve_targets(targets)).results
    assert len({pid for got in alone_pids.by_variant.values() for pid in got}) == len(alone)
    assert _digest(kept) == _digest(alone)


def test_a_hung_worker_is_not_handed_the_next_variant(tmp_path: Path) -> None:
    """The watchdog killed the worker of the last hang: the variant after it gets a worker
    started for it, which runs its trials clean."""
    pids = _Pids()
    runner = Runner(RunOptions(backend="sim", timeout_s=1.0, trials=2, spares=0,
                               out_dir=tmp_path), pids)
    hang, after = runner.run(resolve_targets([str(hang_file(tmp_path, 2)),
                                              "smoke"])).results[:2]
    assert hang.counts["hang"] == 2 and after.trials == 2 and after.status.value == "pass"
    hung = set(pids.by_variant[(hang.scenario, hang.variant)])
    assert not hung & set(pids.by_variant[(after.scenario, after.variant)])
    assert not multiprocessing.active_children()


def test_a_worker_serves_only_the_gpu_it_started_on(tmp_path: Path) -> None:
    """CUDA reads CUDA_VISIBLE_DEVICES once: a worker handed a job for another lane's GPU
    says so, rather than run it on its own GPU."""
    from harness.run.workers import receive, start_local

    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")

    def job(gpu: str, name: str) -> WorkerJob:
        return WorkerJob(scenario, "fixed", "sim", os.getpid(), False, None,
                         str(tmp_path / f"{name}.log"), str(tmp_path / name), {}, gpu=gpu)

    worker = start_local(job("0", "first"))
    try:
        assert receive(worker.conn, 60.0)[0] == "ready"
        worker.take_job(job("1", "second"))
        said = receive(worker.conn, 60.0)
        assert said[0] == "error" and "handed a job for GPU 1" in said[1]
    finally:
        worker.stop()
    assert not multiprocessing.active_children()


def test_the_parent_hears_a_message_and_a_closed_pipe_and_nothing_else() -> None:
    """What the parent asks once per trial: a message waits (it is taken whole), or the
    worker's end closed (it died: GONE), or nothing waits yet."""
    from harness.run.workers import GONE, Worker

    ours, theirs = multiprocessing.Pipe(duplex=True)
    worker = Worker(SimpleNamespace(), ours, None)  # type: ignore[arg-type]
    assert not worker.has_message()
    theirs.send(("trial", {"index": 3}))
    theirs.send(("done",))
    assert worker.has_message() and worker.message() == ("trial", {"index": 3})
    assert worker.has_message() and worker.message() == ("done",)
    assert not worker.has_message()
    theirs.close()
    assert worker.has_message() and worker.message() is GONE
    ours.close()
