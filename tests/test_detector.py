"""The race detector's semantics: small programs over kvcore's public API on the simulated
device, each checked for exactly the findings CUDA's ordering rules imply."""

from __future__ import annotations

import json

import numpy as np
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

import kvcore
from harness.cli import main
from harness.races.detector import Finding, RaceDetector, check_trace
from harness.traces.flight import FlightRecorder
from harness.traces.optrace import load_trace
from harness.lang.targets import SCENARIO_ROOT
from kvcore.device.kernels import Fill, Verify
from seed_port import page_release_race

N = 4096


def findings(program: Callable[[kvcore.Device], None],
             defects: kvcore.Defects = kvcore.Defects()) -> list[Finding]:
    device = kvcore.open_device("sim", defects=defects)
    detector = RaceDetector()
    detector.attach(device)
    program(device)
    return detector.findings


def _bufs(d: kvcore.Device) -> tuple[kvcore.device.Buffer, kvcore.device.Buffer]:
    return d.alloc(N, name="dev"), d.alloc_host(N, name="pinned")


def test_legacy_then_blocking_stream_is_ordered() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        d.launch(Fill(dev, 0, N, 1), d.legacy_stream)
        d.launch(Fill(dev, 0, N, 2), d.create_stream("blocking", blocking=True))
    assert findings(program) == []


def test_blocking_then_legacy_stream_is_ordered() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        d.launch(Fill(dev, 0, N, 1), d.create_stream("blocking", blocking=True))
        d.launch(Fill(dev, 0, N, 2), d.legacy_stream)
    assert findings(program) == []


def test_legacy_then_non_blocking_stream_races() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        d.launch(Fill(dev, 0, N, 1), d.legacy_stream)
        d.launch(Fill(dev, 0, N, 2), d.create_stream("worker"))
    [f] = findings(program)
    assert (f.first.stream, f.second.stream) == ("legacy_stream", "worker")
    assert "record an event on legacy_stream" in f.missing


def test_event_wait_orders_streams() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        a, b = d.create_stream("a"), d.create_stream("b")
        d.launch(Fill(dev, 0, N, 1), a)
        e = d.create_event("e")
        d.record_event(e, a)
        d.wait_event(b, e)
        d.launch(Fill(dev, 0, N, 2), b)
    assert findings(program) == []


def test_event_recorded_but_not_waited_races() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        a, b = d.create_stream("a"), d.create_stream("b")
        d.launch(Fill(dev, 0, N, 1), a)
        d.record_event(d.create_event("e"), a)
        d.launch(Fill(dev, 0, N, 2), b)
    assert len(findings(program)) == 1


def test_wait_on_an_event_recorded_before_the_write_races() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        a, b = d.create_stream("a"), d.create_stream("b")
        e = d.create_event("e")
        d.record_event(e, a)
        d.launch(Fill(dev, 0, N, 1), a)  # after the record: the wait does not cover it
        d.wait_event(b, e)
        d.launch(Fill(dev, 0, N, 2), b)
    assert len(findings(program)) == 1


def test_stream_synchronize_then_host_read_is_ordered() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        s = d.create_stream("s")
        d.copy(host, 0, dev, 0, N, s)
        d.synchronize_stream(s)
        d.host_read(host, 0, N)
    assert findings(program) == []


def test_host_read_before_the_copy_lands_races() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        s = d.create_stream("s")
        d.copy(host, 0, dev, 0, N, s)
        d.host_read(host, 0, N)
    [f] = findings(program)
    assert f.second.stream == "host" and f.space == "host"
    assert "synchronize s" in f.missing


def test_host_write_to_pinned_memory_while_a_copy_from_it_is_pending_races() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        s = d.create_stream("s")
        d.host_fill(host, 0, N, 1)
        d.copy(dev, 0, host, 0, N, s)
        d.host_fill(host, 0, N, 2)  # the copy reads the buffer when it runs, maybe after this
    [f] = findings(program)
    assert f.first.kind == "copy_htod" and not f.first.write
    assert f.second.stream == "host" and f.second.write


def test_host_write_then_copy_is_ordered_by_issue() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        d.host_fill(host, 0, N, 1)
        d.copy(dev, 0, host, 0, N, d.create_stream("s"))
    assert findings(program) == []


def test_event_synchronize_then_host_write_is_ordered() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        s = d.create_stream("s")
        d.copy(dev, 0, host, 0, N, s)
        e = d.create_event("e")
        d.record_event(e, s)
        d.synchronize_event(e)
        d.host_fill(host, 0, N, 2)
    assert findings(program) == []


def test_device_synchronize_orders_everything() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        d.launch(Fill(dev, 0, N, 1), d.create_stream("a"))
        d.synchronize()
        d.launch(Fill(dev, 0, N, 2), d.create_stream("b"))
    assert findings(program) == []


def test_overlapping_ranges_race_disjoint_ones_do_not() -> None:
    def program(lo: int) -> Callable[[kvcore.Device], None]:
        def run(d: kvcore.Device) -> None:
            dev, _ = _bufs(d)
            d.launch(Fill(dev, 0, 1024, 1), d.create_stream("a"))
            d.launch(Fill(dev, lo, 1024, 2), d.create_stream("b"))
        return run
    assert len(findings(program(1023))) == 1
    assert findings(program(1024)) == []


def test_read_read_is_not_a_race() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        result = d.alloc(8, name="result")
        d.launch(Verify(dev, 0, N, 0, result, 0), d.create_stream("a"))
        d.launch(Verify(dev, 0, N, 0, result, 4), d.create_stream("b"))
    assert findings(program) == []


def test_kernel_read_racing_a_copy_write() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        result = d.alloc(4, name="result")
        d.copy(dev, 0, host, 0, N, d.create_stream("a"))
        d.launch(Verify(dev, 0, N, 0, result), d.create_stream("b"))
    [f] = findings(program)
    assert f.first.write and not f.second.write and f.second.kind == "kernel:verify"


def test_same_stream_is_program_ordered() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        s = d.create_stream("s")
        d.copy(dev, 0, host, 0, N, s)
        d.launch(Fill(dev, 0, N, 3), s)
        d.copy(host, 0, dev, 0, N, s)
    assert findings(program) == []


def _reuse(d: kvcore.Device) -> None:
    page_release_race(kvcore.DeviceContext(d), None)


def test_released_and_reused_page_written_from_two_streams_races() -> None:
    [f] = findings(_reuse, kvcore.Defects(release_fence=False))
    assert f.buffer == "kv-arena" and f.page == 0
    assert (f.first.stream, f.second.stream) == ("transfer_stream", "stream")
    assert "given back and handed out again" in f.missing
    assert "before op 8 reuses the bytes" in f.missing


def test_released_and_reused_page_with_the_fence_is_ordered() -> None:
    assert findings(_reuse) == []


def test_oracle_buffers_are_not_judged() -> None:
    def program(d: kvcore.Device) -> None:
        mirror = d.alloc_host(N, name="mirror", role="oracle")
        result = d.alloc(4, name="result")
        d.launch(Verify(mirror, 0, N, 0, result), d.create_stream("s"))
        d.host_fill(mirror, 0, N, 1)
    assert findings(program) == []


def _publish(d: kvcore.Device) -> None:
    from programs import legacy_publish_trials

    legacy_publish_trials(d, 1)


def test_legacy_stream_table_publish_races_its_reader() -> None:
    found = findings(_publish, kvcore.Defects(publish_on_legacy_stream=True))
    assert any(f.buffer == "exec-table" and f.first.stream == "legacy_stream"
               and f.second.kind == "kernel:read_table" for f in found)


def test_table_publish_on_the_callers_stream_is_ordered() -> None:
    assert findings(_publish) == []


def test_repeated_race_is_folded_with_a_count() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        a, b = d.create_stream("a"), d.create_stream("b")
        for _ in range(10):
            d.launch(Fill(dev, 0, 64, 1), a)
            d.launch(Fill(dev, 0, 64, 2), b)
            d.synchronize()
    [f] = findings(program)
    assert f.count == 10


def test_finding_names_the_python_call_site() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        d.launch(Fill(dev, 0, N, 1), d.create_stream("a"))
        d.launch(Fill(dev, 0, N, 2), d.create_stream("b"))
    [f] = findings(program)
    assert f.second.site is not None and f.second.site.startswith(__file__)


def test_offline_check_of_a_trace_finds_the_same_races(tmp_path: Path) -> None:
    device = kvcore.open_device("sim", defects=kvcore.Defects(release_fence=False))
    online = RaceDetector()
    online.attach(device)
    recorder = FlightRecorder(tmp_path)
    recorder.attach(device)
    recorder.start_trial({"scenario": "seed"})
    page_release_race(kvcore.DeviceContext(device), None)
    path = Path(recorder.end_trial(0, keep=True) or "")
    offline = check_trace(load_trace(path).records).findings
    assert [f.to_json() for f in offline] == [f.to_json() for f in online.findings]
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 1 and "nothing orders transfer_stream's write" in result.output


def test_check_of_a_clean_trace_exits_0(tmp_path: Path) -> None:
    device = kvcore.open_device("sim")
    recorder = FlightRecorder(tmp_path)
    recorder.attach(device)
    recorder.start_trial({"scenario": "seed"})
    page_release_race(kvcore.DeviceContext(device), None)
    path = recorder.end_trial(0, keep=True)
    result = CliRunner().invoke(main, ["check", str(path), "--format", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["findings"] == []


def test_buggy_variants_detected_on_trial_1_without_amplification(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "run", *(str(SCENARIO_ROOT / n) for n in ("release_fence.yaml", "cross_stream_race.yaml",
                                                  "catalog_reactivation.yaml")),
        "--dangerous", "--backend", "sim", "--no-amplify", "--variant", "buggy", "--trials",
        "1", "--format", "json", "--out", str(tmp_path)])
    doc = json.loads(result.stdout)
    assert [r["detected"] for r in doc["results"]] == [1, 1, 1]
    assert all(r["manifested"] == 0 and r["status"] == "pass" for r in doc["results"])


def test_fixed_variants_have_no_findings_over_300_trials(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "run", *(str(SCENARIO_ROOT / n) for n in ("release_fence.yaml", "cross_stream_race.yaml",
                                                  "catalog_reactivation.yaml")),
        "--dangerous", "--backend", "sim", "--variant", "fixed", "--trials", "300",
        "--format", "json", "--out", str(tmp_path)])
    doc = json.loads(result.stdout)
    assert [(r["trials"], r["detected"], r["manifested"]) for r in doc["results"]] == \
        [(300, 0, 0)] * 3


def test_pruned_histories_find_exactly_the_racing_ops_of_full_ones() -> None:
    """Dropping accesses that a later covering access stands for must not lose a race: on random
    programs, the ops found racing are the same with and without pruning."""
    import random

    raced = dropped = 0
    for seed in range(60):
        rng = random.Random(seed)
        device = kvcore.open_device("sim")
        pruned, full = RaceDetector(), RaceDetector(prune=False)
        pruned.attach(device)
        full.attach(device)
        streams = [device.create_stream(f"s{i}", blocking=i == 2) for i in range(3)]
        streams.append(device.legacy_stream)
        dev, host = device.alloc(256, name="dev"), device.alloc_host(256, name="pinned")
        result = device.alloc(4, name="result")
        events = [device.create_event(f"e{i}") for i in range(2)]
        for _ in range(40):
            n = rng.choice([16, 32, 64])
            lo = rng.randrange(0, 256 - n + 1, 16)
            s = rng.choice(streams)
            action = rng.randrange(8)
            if action == 0:
                device.launch(Fill(dev, lo, n, 1), s)
            elif action == 1:
                device.copy(dev, lo, host, lo, n, s)
            elif action == 2:
                device.copy(host, lo, dev, lo, n, s)
            elif action == 3:
                device.launch(Verify(dev, lo, n, 0, result), s)
            elif action == 4:
                device.host_fill(host, lo, n, 2)
            elif action == 5:
                device.record_event(rng.choice(events), s)
            elif action == 6:
                device.wait_event(s, rng.choice(events))
            else:
                device.synchronize_stream(s)
        assert pruned.racing == full.racing, seed
        raced += len(full.racing)
        dropped += _remembered(full) - _remembered(pruned)
    assert raced > 0 and dropped > 0  # the programs do race, and pruning did drop accesses


def _remembered(detector: RaceDetector) -> int:
    return sum(shadow.remembered() for shadow in detector._shadows.values())


def test_synchronous_copy_orders_the_host_after_it() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        d.copy_sync(host, 0, dev, 0, N)
        d.host_read(host, 0, N)
        d.launch(Fill(dev, 0, N, 1), d.create_stream("later"))  # issued after the host waited
    assert findings(program) == []


def test_synchronous_copy_does_not_wait_for_a_non_blocking_stream() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        d.launch(Fill(dev, 0, N, 1), d.create_stream("worker"))
        d.copy_sync(host, 0, dev, 0, N)
    [f] = findings(program)
    assert f.first.stream == "worker" and f.second.stream == "legacy_stream"


def test_synchronous_copy_waits_for_a_blocking_stream() -> None:
    def program(d: kvcore.Device) -> None:
        dev, host = _bufs(d)
        d.launch(Fill(dev, 0, N, 1), d.create_stream("blocking", blocking=True))
        d.copy_sync(host, 0, dev, 0, N)
    assert findings(program) == []


def test_pageable_copy_may_return_before_its_dma_lands() -> None:
    def program(d: kvcore.Device) -> None:
        dev, _ = _bufs(d)
        result = d.alloc(4, name="result")
        d.copy_from_pageable(dev, 0, np.full(N, 7, np.uint8))
        d.launch(Verify(dev, 0, N, 7, result), d.create_stream("reader"))
    [f] = findings(program)
    assert f.first.stream == "legacy_stream" and f.first.kind == "copy_htod"
    assert f.second.kind == "kernel:verify"


def test_pageable_copy_lands_on_the_device() -> None:
    device = kvcore.open_device("sim")
    dev, host = _bufs(device)
    device.copy_from_pageable(dev, 0, np.arange(N, dtype=np.uint8))
    device.synchronize()
    device.copy_sync(host, 0, dev, 0, N)
    assert (device.host_read(host, 0, N) == np.arange(N, dtype=np.uint8)).all()


def _repeated_program(device: kvcore.Device, rng: object, trials: int,
                      detectors: list[RaceDetector]) -> list[list[list[dict]]]:
    """One random program (pool pages leased, written from several streams, released and
    leased again; plain copies, kernels, host writes, events, syncs) run ``trials`` times on
    one device, the detectors reset before each run: each detector's findings per run."""
    import random

    assert isinstance(rng, random.Random)
    streams = [device.create_stream(f"s{i}", blocking=i == 2) for i in range(3)]
    streams.append(device.legacy_stream)
    context = kvcore.DeviceContext(device, stream=streams[0], transfer_stream=streams[1])
    pool = kvcore.DeviceKVPagePool(context, kvcore.KVPageGeometry(
        (kvcore.KVPlaneGeometry(kvcore.DType.I8, 1, 1, 16),), page_tokens=256), 2)
    host = device.alloc_host(256, name="pinned")
    events = [device.create_event(f"e{i}") for i in range(2)]
    program = [(rng.randrange(9), rng.choice([16, 32, 64]), rng.randrange(0, 192, 16),
                rng.randrange(4), rng.randrange(2)) for _ in range(30)]
    seen: list[list[list[dict]]] = [[] for _ in detectors]
    for _ in range(trials):
        for detector in detectors:
            detector.reset()
        leases: list[kvcore.DeviceKVPageLease] = []
        for action, n, lo, s, e in program:
            stream = streams[s]
            if action == 0 and pool.free_pages:
                leases += pool.materialize(1, name=f"lease {len(leases)}")
            elif action == 1 and leases:
                pool.release(leases.pop(0))
            elif action == 2 and leases:
                page = leases[0].handle.index * pool.page_stride
                device.copy(pool.buffer, page, host, lo, 64, stream)
            elif action == 3:
                device.launch(Fill(pool.buffer, lo, n, 1), stream)
            elif action == 4:
                device.copy(host, lo, pool.buffer, lo, n, stream)
            elif action == 5:
                device.host_fill(host, lo, n, 2)
            elif action == 6:
                device.record_event(events[e], stream)
            elif action == 7:
                device.wait_event(stream, events[e])
            else:
                device.synchronize_stream(stream)
        device.synchronize()
        pool.release(leases)
        for k, detector in enumerate(detectors):
            seen[k].append([f.to_json() for f in detector.findings])
    return seen


def test_a_remembered_trial_gives_exactly_the_findings_of_a_fresh_analysis() -> None:
    """Trials whose records repeat get a remembered analysis, renumbered: on random programs
    run again and again on one device (pages released and reused, so owners and their names
    matter), every run's findings equal those of a detector that analyses every run afresh,
    op numbers included."""
    import random

    hits = compared = 0
    for seed in range(40):
        device = kvcore.open_device("sim", defects=kvcore.Defects(release_fence=seed % 2 == 0))
        remembering, fresh = RaceDetector(), RaceDetector(remember=False)
        remembering.attach(device)
        fresh.attach(device)
        got, want = _repeated_program(device, random.Random(seed), 4, [remembering, fresh])
        assert got == want, seed
        hits += remembering._memo.hits
        compared += sum(map(len, want))
    assert hits > 40 and compared > 0  # runs were remembered, and they had findings to match


def test_records_after_a_remembered_trial_are_analysed_with_all_before_them() -> None:
    """Findings read in the middle of a trial that matched a remembered one, then more ops:
    the later findings are those of the whole trial."""
    device = kvcore.open_device("sim")
    dev, host = _bufs(device)
    a, b = device.create_stream("a"), device.create_stream("b")
    remembering, fresh = RaceDetector(), RaceDetector(remember=False)
    remembering.attach(device)
    fresh.attach(device)
    for _ in range(3):
        for d in (remembering, fresh):
            d.reset()
        device.copy(dev, 0, host, 0, 64, a)
        assert [f.to_json() for f in remembering.findings] == \
            [f.to_json() for f in fresh.findings] == []
        device.copy(dev, 0, host, 0, 64, b)  # races the copy on a
        got = [f.to_json() for f in remembering.findings]
        assert got == [f.to_json() for f in fresh.findings] and len(got) == 1
        device.synchronize()
    assert remembering._memo.hits >= 2


def test_a_remembered_trial_is_not_reused_when_its_bytes_had_other_owners() -> None:
    """The same ops, but the pinned buffer they race on was handed to another owner between
    the trials: the findings name the owner of now, not the remembered one."""
    device = kvcore.open_device("sim")
    dev, host = _bufs(device)
    a = device.create_stream("a")
    detector = RaceDetector()
    detector.attach(device)
    owners = []
    for name in ("buffer first", "buffer first", "buffer second"):
        device.label(host, [(0, N)], name)
        detector.reset()
        device.copy(dev, 0, host, 0, 64, a)
        device.host_fill(host, 0, 64, 7)  # rewrites the bytes the copy may still read
        owners.append([f.owner for f in detector.findings])
        device.synchronize()
    assert owners == [["buffer first"], ["buffer first"], ["buffer second"]]
    assert detector._memo.hits == 1


def test_a_new_device_built_as_the_last_one_keeps_the_remembered_trials() -> None:
    """A run on the simulated device makes a new device and world every trial: a detector
    attached to each in turn reuses the analyses of the trials before when the new device
    declares the same buffers and streams (every zoo variant's findings, trial by trial, are
    those of a fresh analysis, op numbers included), and forgets them when a stream of the
    same name orders otherwise (a blocking stream, which the legacy stream waits for)."""
    from harness.lang.scenario import load_scenario
    from harness.run.executor import TrialExecutor

    hits = 0
    for path in (SCENARIO_ROOT / "cross_stream_race.yaml", SCENARIO_ROOT / "zoo" / "cupy_8789.yaml",
                 SCENARIO_ROOT / "stale_row_write.yaml"):
        scenario = load_scenario(path)
        for variant in scenario.variants:
            remembering, fresh = RaceDetector(), RaceDetector(remember=False)

            def attach(device: kvcore.Device, remembering: RaceDetector = remembering,
                       fresh: RaceDetector = fresh) -> None:
                remembering.attach(device)
                fresh.attach(device)

            executor = TrialExecutor(scenario, variant, "sim", amplify=False, on_device=attach)
            for index in range(6):
                remembering.reset()
                fresh.reset()
                executor.run(index, index)
                assert remembering.findings_json() == [f.to_json() for f in fresh.findings]
            hits += remembering._memo.hits
    assert hits >= 6 * 5 - 1  # all but the first trial of each variant remembered, near enough

    found = []
    detector = RaceDetector()
    for blocking in (False, False, True):
        device = kvcore.open_device("sim")
        detector.attach(device)
        dev, host = _bufs(device)
        a = device.create_stream("a", blocking=blocking)
        detector.reset()
        device.copy(dev, 0, host, 0, 64, a)
        device.copy(host, 0, dev, 0, 64, device.legacy_stream)  # waits for a blocking stream
        found.append((len(detector.findings), detector._memo.hits))
        device.synchronize()
    assert found == [(1, 0), (1, 1), (0, 0)]  # the second remembered; the third a new memo


def test_the_detector_benchmark_runs_on_the_simulated_device(capsys) -> None:
    """`python -m harness.bench --detector --backend sim`: on and off, in the executor and in
    a worker, for both variants; the buggy variant's trials all race, the fixed one's none."""
    import re

    from harness import bench

    assert bench.main(["--detector", "--backend", "sim", "--trials", "100", "--delays", "0"]) == 0
    rows = re.findall(r"(buggy|fixed), delay +0 us, +(executor|worker): on .* ratio [0-9.]+ "
                      r"+\(trials with findings: (\d+)/100\)", capsys.readouterr().out)
    assert sorted(rows) == [("buggy", "executor", "100"), ("buggy", "worker", "100"),
                            ("fixed", "executor", "0"), ("fixed", "worker", "0")]


def test_a_reissued_trial_cut_where_the_host_blocks_is_remembered_and_its_json_moved() -> None:
    """A reissued trial comes as segments, cut where the host blocks (a flight recorder's
    flushes cut it): the memo knows the pieces by their identities, and the findings' JSON a
    worker sends is the remembered trial's, renumbered, equal to a fresh analysis's, op
    numbers included (a world kept, so every trial's ops are numbered on from the last). So
    is a trial run step by step, its records' lines and numbers their own."""
    from harness.lang.scenario import load_scenario
    from harness.run.executor import TrialExecutor

    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    for variant, reissue in (("buggy", True), ("fixed", True), ("buggy", False)):
        remembering, fresh = RaceDetector(), RaceDetector(remember=False)
        pieces: list[int] = []

        def attach(device: kvcore.Device, remembering: RaceDetector = remembering,
                   fresh: RaceDetector = fresh) -> None:
            remembering.attach(device)
            fresh.attach(device)
            device.oplog.before_blocking(lambda: None)  # cut where the host blocks

        executor = TrialExecutor(scenario, scenario.variant(variant), "sim", amplify=False,
                                 on_device=attach, keep_world=True, reissue=reissue)
        seqs = set()
        for index in range(8):
            remembering.reset()
            fresh.reset()
            executor.run(index, index)
            pieces.append(len(remembering._pending))
            got = remembering.findings_json()
            want = [f.to_json() for f in fresh.findings]
            assert got == want and got == [f.to_json() for f in remembering.findings], index
            seqs |= {f["second"]["seq"] for f in got}
            assert bool(got) == (variant == "buggy")
        assert executor.reissued == (6 if reissue else 0) and pieces[-1] > 1
        assert remembering._memo.hits >= 5
        assert variant == "fixed" or len(seqs) == 8  # each trial's own numbers
