"""Device programs: calls captured once and issued again (kvcore), and the executor's reissued
trials against trials run step by step: the same outcomes, details and op records."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import kvcore
from conftest import make_device
from harness.run.executor import TrialExecutor, reissuable
from harness.lang.model import PlaneSpec, PoolSpec
from harness.results.outcome import Outcome, TrialResult
from harness.lang.scenario import load_scenario
from harness.lang.targets import SCENARIO_ROOT, resolve_targets
from kvcore.device.kernels import Fill
from kvcore.device.oplog import OpRecord, OpRecorder

PAGE = 4096


def without_stamps(record: OpRecord) -> tuple[object, ...]:
    """What a record says but when and as which number."""
    return (record.stream, record.kind, record.reads, record.writes, record.records,
            record.waits, record.syncs, record.step, record.detail)


def test_a_reissued_program_makes_the_same_calls_and_writes_the_same_records(
        backend: str, request: pytest.FixtureRequest) -> None:
    device = make_device(backend, request)
    a, b = device.create_stream("a"), device.create_stream("b")
    dev = device.alloc(PAGE, name="dev")
    host = device.alloc_host(3 * PAGE, name="host")
    done = device.create_event("done")
    recorder = OpRecorder(device.oplog)
    try:
        with device.capture() as program:
            device.oplog.step = "fill"
            device.host_fill(host, 0, PAGE, 0x11)
            device.copy(dev, 0, host, 0, PAGE, a)
            device.record_event(done, a)
            device.wait_event(b, done)
            device.launch(Fill(dev, 0, 16, 0x22), b)
            device.copy(host, PAGE, dev, 0, PAGE, b)
            device.synchronize()
        device.oplog.step = None
        captured = list(recorder.records)
        assert program.refused is None and program.observed
        assert [r.kind for r in captured] == [
            "host_write", "copy_htod", "event_record", "event_wait", "kernel:fill",
            "copy_dtoh", "sync_device"]
        device.host_fill(host, PAGE, PAGE, 0)  # not captured: the program must redo the copy
        del recorder.records[:]
        before = device.oplog.seq
        device.reissue(program)
        again = list(recorder.records)
    finally:
        recorder.close()
    assert [without_stamps(r) for r in again] == [without_stamps(r) for r in captured]
    assert [r.seq for r in again] == [before + 1 + k for k in range(len(captured))]
    back = device.host_read(host, PAGE, PAGE)
    assert (back[:16] == 0x22).all() and (back[16:] == 0x11).all()


def test_a_call_captured_as_itself_runs_again_in_full(backend: str,
                                                      request: pytest.FixtureRequest) -> None:
    device = make_device(backend, request)
    host = device.alloc_host(PAGE, name="host")
    made: list[int] = []

    def stamp() -> None:  # what differs every time it runs
        made.append(len(made) + 1)
        device.host_write(host, 0, np.array([made[-1]], np.int32))

    with device.capture() as program:
        device.reissued(stamp)
        device.host_fill(host, 4, 4, 0x7F)
    device.host_fill(host, 0, 8, 0)
    device.reissue(program)
    device.reissue(program)
    assert made == [1, 2, 3]
    assert device.host_read(host, 0, 8).tolist() == [3, 0, 0, 0, 0x7F, 0x7F, 0x7F, 0x7F]


@pytest.mark.parametrize("what, why", [
    (lambda d: d.create_event("late"), "an event's creation"),
    (lambda d: d.alloc(64, name="late"), "an allocation"),
    (lambda d: d.query_event(d.create_event("q")), "an event's creation"),
    (lambda d: d.create_stream("late"), "a stream's creation"),
])
def test_a_program_refuses_what_it_cannot_stand_for(what, why: str) -> None:
    device = kvcore.open_device("sim")
    with device.capture() as program:
        what(device)
    assert program.refused == why
    with pytest.raises(kvcore.DeviceUsageError, match="cannot be issued again"):
        device.reissue(program)


def test_a_program_is_issued_only_to_the_observers_it_was_captured_for() -> None:
    device = kvcore.open_device("sim")
    host = device.alloc_host(64, name="h")
    with device.capture() as program:
        device.host_fill(host, 0, 64, 1)
    assert program.refused is None and not program.observed
    recorder = OpRecorder(device.oplog)
    with pytest.raises(kvcore.DeviceUsageError, match="observers changed"):
        device.reissue(program)
    recorder.close()


def test_a_fault_in_a_reissued_program_names_the_item_that_raised() -> None:
    """A program captured while the pages held what attention expects; issued again after the
    host's page changed, its asserting attention faults the device, as the code would have."""
    device = kvcore.open_device("sim")
    stream = device.create_stream("s")
    context = kvcore.DeviceContext(device, stream=stream, transfer_stream=stream)
    geometry = PoolSpec(pages=1, page_tokens=64, planes=(PlaneSpec("i8", 8, 2, 256),)).geometry()
    pool = kvcore.DeviceKVPagePool(context, geometry, 1)
    layout = kvcore.plan_host_kv_page_layout(pool.geometry)
    arena = kvcore.HostKVArena(context, 2 * layout.page_stride, [layout])
    host = arena.writable_view(arena.allocate(layout, 1))
    listing_host = device.alloc_host(64, name="list")
    result = device.alloc(4, name="result")
    [lease] = pool.materialize(1)
    listing = kvcore.PageIndex(pool, listing_host, 0, 64)
    listing.write([lease.handle])
    host.fill(0x5A)
    with device.capture() as program:
        device.oplog.step = "write"
        pool.copy_from_host(host, [lease.handle], stream)
        device.oplog.step = "attend"
        listing.attend(0x5A, stream, result=result)
        device.oplog.step = "wait"
        device.synchronize_stream(stream)
    assert program.refused is None and device.fault is None
    host.fill(0x11)  # the page the program copies no longer holds what attention expects
    with pytest.raises(kvcore.DeviceFaultError):
        device.reissue(program)
    assert program.step_at(program.failed_at) in ("attend", "wait")
    assert device.fault is not None


def _segment_program(device: kvcore.Device) -> tuple[object, dict[str, object]]:
    """A program with what a segment must carry: plain actions, a call that writes a record of
    its own in the middle, a memset of a Live byte, a live store, and a synchronize."""
    from kvcore.device.program import Live

    s = device.create_stream("s")
    dev = device.alloc(PAGE, name="dev")
    host = device.alloc_host(2 * PAGE, name="host")
    counts = np.zeros(4, np.int32)
    byte = Live(0x21)
    state: dict[str, object] = {"dev": dev, "host": host, "counts": counts, "byte": byte}

    def bump() -> None:  # what differs every time: the next byte and counts, and a record
        byte.value += 1
        counts[:] += 1
        device.host_fill(host, PAGE, 8, byte.value)

    with device.capture() as program:
        device.oplog.step = "fill"
        device.host_fill(host, 0, 64, 0x11)
        device.copy(dev, 0, host, 0, 64, s)
        device.oplog.step = "bump"
        device.reissued(bump)
        device.oplog.step = "scrub"
        device.memset(dev, 64, 64, byte, s)
        device.host_write(host, 128, counts, live=True)
        device.copy(host, 256, dev, 0, 128, s)
        device.oplog.step = "wait"
        device.synchronize_stream(s)
    device.oplog.step = None
    assert program.refused is None
    return program, state


def test_segments_are_the_records_a_reissued_program_writes(
        backend: str, request: pytest.FixtureRequest) -> None:
    """Issued to an observer that takes segments, a program hands over its records unbuilt
    and in as few pieces as it can: built, they are the records an observer of records gets
    (numbers and details, a Live byte's as it was set, included; the device's times left
    out), a record written by a call in between goes out in its place, and a blocking hook
    sees every record issued before its wait."""
    from kvcore.device.oplog import expanded

    device = make_device(backend, request)
    entries: list[object] = []
    unsubscribe = device.oplog.subscribe(entries.append, segments=entries.append)
    hooked: list[int] = []

    def hook() -> None:
        hooked.append(len(expanded(entries)))

    device.oplog.before_blocking(hook)
    try:
        program, state = _segment_program(device)
        del entries[:], hooked[:]
        device.reissue(program)
        segmented = expanded(entries)
        kinds = [type(e).__name__ for e in entries]
        waited = list(hooked)
        unsubscribe()
        recorder = OpRecorder(device.oplog)
        device.reissue(program)
        built = list(recorder.records)
        recorder.close()
    finally:
        device.oplog.blocking_hooks.remove(hook)
        unsubscribe()
    # The call's host_fill splits the run; the hook splits it again before the wait.
    assert kinds == ["Segment", "OpRecord", "Segment", "Segment"]
    assert waited == [len(segmented) - 1]
    assert [r.seq for r in segmented] == list(range(segmented[0].seq,
                                                    segmented[0].seq + len(segmented)))
    shift = built[0].seq - segmented[0].seq
    assert [r.seq + shift for r in segmented] == [r.seq for r in built]
    byte = state["byte"].value  # type: ignore[attr-defined]
    memsets = [(a.detail or {}).get("value") for a in segmented if a.kind == "memset"]
    assert memsets == [byte - 1] and \
        [(b.detail or {}).get("value") for b in built if b.kind == "memset"] == [byte]
    for a, b in zip(segmented, built):  # the byte's records (a memset, bump's fill) aside
        same = without_stamps(a)[:-1] == without_stamps(b)[:-1]
        assert same and (a.detail == b.detail or a.kind == "memset" or a.step == "bump")
        # A segment's records carry no times; the call's own record is built as it is made.
        assert (a.t_issue_ns is None) == (a.step != "bump") and b.t_issue_ns is not None
    back = device.host_read(state["host"], 256, 128)  # type: ignore[arg-type]
    assert (back[:64] == 0x11).all() and (back[64:] == byte).all()
    assert device.host_read(state["host"], 128, 16).view(np.int32).tolist() == [3] * 4


def test_a_live_store_needs_an_array_of_its_own() -> None:
    device = kvcore.open_device("sim")
    host = device.alloc_host(64, name="h")
    with pytest.raises(kvcore.DeviceUsageError, match="contiguous 1-D array"):
        device.host_write(host, 0, np.zeros((2, 2), np.int32)[:, 0], live=True)


def test_a_fault_in_a_segment_hands_over_the_records_before_it() -> None:
    """The same fault as above, issued to an observer that takes segments: the records of the
    items before the one that raised go out, numbered on from the last."""
    device = kvcore.open_device("sim")
    stream = device.create_stream("s")
    host = device.alloc_host(64, name="h")
    dev = device.alloc(64, name="d")
    entries: list[object] = []
    device.oplog.subscribe(entries.append, segments=entries.append)
    with device.capture() as program:
        device.host_fill(host, 0, 64, 1)
        device.copy(dev, 0, host, 0, 64, stream)
        device.synchronize_stream(stream)
    before = device.oplog.seq
    del entries[:]
    device.fault = kvcore.DeviceFaultError("an earlier fault", cuda_error="cudaErrorAssert")
    with pytest.raises(kvcore.DeviceFaultError):
        device.reissue(program)  # refused at once: nothing issued
    assert entries == [] and device.oplog.seq == before
    device.fault = None

    def failing(*args: object) -> None:
        raise kvcore.DeviceFaultError("the copy failed", cuda_error="cudaErrorIllegalAddress")

    run = program.run(0, len(program.calls), False)
    plain = run.chunks[0].plain
    copy = next(k for k, call in enumerate(plain) if program.items[call.index].name == "_do_copy")
    i = plain[copy].index
    plain[copy] = plain[copy]._replace(fn=failing)
    with pytest.raises(kvcore.DeviceFaultError):
        device.reissue(program)
    assert program.failed_at == i
    from kvcore.device.oplog import expanded

    assert [r.kind for r in expanded(entries)] == ["host_write"]
    assert device.oplog.seq == before + 1


# ---- the executor --------------------------------------------------------------------------------
def _cases() -> list[tuple[str, str]]:
    out = []
    for scenario in resolve_targets(["scenarios", "zoo"], ()):
        for variant in scenario.variants:
            if reissuable(scenario.steps_of(variant.name), schedule=None, timeline=False,
                          workload=scenario.workload):
                out.append((str(scenario.path), variant.name))
    return out


def recorded_trials(path: object, variant: str, backend: str, trials: int,
                    shown: Callable[[OpRecord], object], **how: object
                    ) -> tuple[TrialExecutor, list[tuple[TrialResult, list[object]]]]:
    """``trials`` trials of a variant, each with its op records as ``shown`` gives them."""
    scenario = load_scenario(path)  # type: ignore[arg-type]
    recorders: list[OpRecorder] = []
    executor = TrialExecutor(scenario, scenario.variant(variant), backend,  # type: ignore
                             on_device=lambda d: recorders.append(OpRecorder(d.oplog)), **how)
    [recorder] = recorders
    out = []
    for index in range(trials):
        del recorder.records[:]
        result = executor.run(index, index)
        out.append((result, [shown(r) for r in recorder.records]))
    recorder.close()
    return executor, out


def _trials(path: str, variant: str, *, reissue: bool, amplify: bool, trials: int,
            delay_us: float | None = None) -> tuple[TrialExecutor, list[tuple[object, ...]]]:
    """On sim, in a world kept across trials: each trial's outcome, words and records."""
    executor, got = recorded_trials(path, variant, "sim", trials, OpRecord.to_json,
                                    amplify=amplify, delay_us=delay_us, reissue=reissue,
                                    keep_world=True)
    return executor, [(r.outcome, r.detail, r.step, records) for r, records in got]


CASES = _cases()
QUERYING = {("cupy-8789", "fixed"), ("trtllm-15546", "fixed")}
"""Reissuable variants whose trials query an event, which no program can stand for: a pinned
block freed after an event, which the next host_alloc asks about (the fixes of both)."""


def test_the_reissued_cases_cover_the_catalog_and_the_zoo() -> None:
    names = {load_scenario(path).name for path, _ in CASES}
    assert {"cross-stream-race", "release-fence", "store-before-write", "pytorch-2702",
            "vllm-36013", "megatron-5715", "trtllm-15607", "stale-row-write", "cupy-8789",
            "lmcache-4830", "cucascade-158", "trtllm-15546"} <= names


def _same_trials(path: str, variant: str, trials: int,
                 **how: object) -> tuple[int, list[Outcome]]:
    """Run ``trials`` step by step and reissued; assert they are the same trials, and return
    how many were reissued and their outcomes (the last ones)."""
    stepped, want = _trials(path, variant, reissue=False, trials=trials, **how)  # type: ignore
    fast, got = _trials(path, variant, reissue=True, trials=trials, **how)  # type: ignore
    assert stepped.program is None
    for index, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{path} {variant} trial {index}"
    outcomes = [outcome for outcome, *_ in got]  # type: ignore[misc]
    return fast.reissued, outcomes[trials - fast.reissued:]


@pytest.mark.parametrize("amplify", [False, True], ids=["unamplified", "amplified"])
def test_reissued_trials_are_the_trials_step_by_step(amplify: bool) -> None:
    """Every reissuable variant of the catalog and the zoo, on a simulated device that keeps
    its world: trial by trial, the same outcome, the same words, and the same op records,
    times and numbers included (the simulated device's clock and random draws follow the
    calls, so any call more, less or out of order would show). Every variant expected clean
    is captured in its second trial (its first makes the pool's fence events) and reissued
    from then on, but for those whose trials query an event (:data:`QUERYING`)."""
    for path, variant in CASES:
        reissued, _ = _same_trials(path, variant, 12, amplify=amplify)
        if (load_scenario(path).name, variant) in QUERYING:
            executor, _ = _trials(path, variant, reissue=True, amplify=amplify, trials=2)
            assert reissued == 0 and "event query" in str(executor.unkept), executor.unkept
        elif load_scenario(path).variant(variant).expect == "clean":
            assert reissued == 10, (path, variant)


TABLE_ROUND = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: table-round,
  description: a row republished every trial with a page whose generation grew}
spec:
  pool: {pages: 2, page_tokens: 16, planes: [{dtype: i8, leading: 8, heads: 1, align: 256}],
         table_rows: 1, max_pages_per_row: 1}
  variants: {only: {expect: clean}}
  steps:
    - {id: p, op: materialize, pages: 1}
    - {id: conv, op: catalog}
    - {op: retain, catalog: conv, lease: p}
    - {op: bind, catalog: conv}
    - {op: activate, catalog: conv, stream: compute}
    - {id: reads-row, op: read_table, catalog: conv, stream: compute, assert: false}
    - {op: page_list, buffer: blocks, lease: p}
    - {op: gather, page_list: blocks, to: gathered, stream: compute}
    - {op: synchronize}
    - {op: release_catalog, catalog: conv}
"""


def test_a_reissued_publish_stores_the_generation_the_pool_counts_now(tmp_path) -> None:
    """A table row republished every trial with a page the last trial released (its
    generation one more each time), read by a counting table reader that checks each entry's
    generation: reissued, the row's entries are worked out again as the pool counts them, so
    every trial is clean, as step by step (a program that kept the captured trial's bytes
    would publish a stale generation from its second trial on). So are a page list's."""
    path = tmp_path / "table_round.yaml"
    path.write_text(TABLE_ROUND)
    reissued, outcomes = _same_trials(str(path), "only", 12, amplify=False)
    assert reissued == 10
    assert outcomes == [Outcome.CLEAN] * 10
    # A page list in pinned memory holds the same entries, generations included, after each
    # trial reissued as after each trial step by step.
    scenario = load_scenario(path)
    lists = []
    for reissue in (False, True):
        executor = TrialExecutor(scenario, scenario.variant("only"), "sim", amplify=False,
                                 reissue=reissue, keep_world=True)
        world = executor.world(0)
        view = world.host["blocks"].view
        got = []
        for index in range(12):
            executor.run(index, index)
            got.append(world.device.host_read(view.buffer, view.page_offset(0), 8).tolist())
        lists.append(got)
    assert lists[0] == lists[1]
    assert len({tuple(entries) for entries in lists[0]}) == 12  # a generation more each trial


@pytest.mark.parametrize("name, delay_us", [
    ("cross_stream_race", 58.0), ("release_fence", 58.0), ("zoo/megatron_5715", 36.0),
    ("zoo/trtllm_15607", 20.0), ("zoo/trtllm_15546", 30.0)])
def test_a_reissued_trial_that_fails_a_check_ends_as_the_step_path_does(name: str,
                                                                         delay_us: float) -> None:
    """A delay at the edge of the race window on sim makes some trials clean and some
    corrupt: a reissued trial that fails a check skips the checks after it (release-fence has
    two), synchronizes and cleans up as the step path does, and the next trial is right. A
    counting attention's words (megatron-5715, trtllm-15607) name the lease that held the page
    it read wrong, as the step path does, not the captured trial's leases after its end; a
    trial's pinned blocks (trtllm-15546's host_alloc) go back as the step path gives them."""
    _, reissued = _same_trials(str(SCENARIO_ROOT / f"{name}.yaml"), "buggy", 30, amplify=True,
                               delay_us=delay_us)
    assert Outcome.CORRUPTION in reissued and Outcome.CLEAN in reissued


def test_the_scrub_rides_only_on_the_last_read_of_the_pool() -> None:
    """The check whose wait may cover the trial's scrub: the last to read the pool, on the
    scenario's own thread, with only checks of buffers after it."""
    from harness.run.executor import _last_pool_read
    from harness.lang.model import Step

    def check(thread: str | None = None, **args: object) -> Step:
        return Step("check", dict(args), thread=thread)

    lease, buffer = check(lease="a"), check(buffer="b", byte=1)
    assert _last_pool_read((Step("synchronize", {}), lease, buffer)) is lease
    assert _last_pool_read((lease, check("t", lease="b"))) is None  # a thread reads after it
    assert _last_pool_read((lease, Step("release", {"lease": "a"}))) is None
    assert _last_pool_read((buffer,)) is None


def test_the_detector_on_segments_finds_what_it_finds_on_records() -> None:
    """Every reissuable variant of the catalog and the zoo, trial by trial: a detector alone
    (its reissued trials come as segments, and its analyses are remembered) gives the findings
    of a detector that analyses every trial afresh from records, op numbers included."""
    from harness.races.detector import RaceDetector

    for path, variant in CASES:
        scenario = load_scenario(path)
        got = []
        for records in (False, True):
            detector = RaceDetector(remember=not records)

            def attach(device: kvcore.Device, d: RaceDetector = detector,
                       plain: bool = records) -> None:
                d.attach(device)
                if plain:
                    device.oplog.subscribe(lambda r: None)  # wants records: no segments

            executor = TrialExecutor(scenario, scenario.variant(variant), "sim", amplify=True,
                                     on_device=attach, keep_world=True)
            seen = []
            for index in range(8):
                detector.reset()
                executor.run(index, index)
                seen.append([f.to_json() for f in detector.findings])
            got.append((seen, executor.reissued))
        (segmented, reissued), (fresh, _) = got
        assert segmented == fresh, (path, variant)
        if scenario.variant(variant).expect == "clean":
            assert reissued == (0 if (scenario.name, variant) in QUERYING else 6), variant





def test_a_capture_goes_through_its_recorder_and_leaves_the_device_as_it_was(
        backend: str, request: pytest.FixtureRequest) -> None:
    """The device's actions go through one attribute: the recorder while a capture runs, the
    device again after it, even when the block raised; nothing else of the device changes."""
    from kvcore.device.recorder import Recorder

    device = make_device(backend, request)
    host = device.alloc_host(PAGE, name="host")
    attributes = set(vars(device))
    with device.capture() as program:
        assert isinstance(device._actions, Recorder)
        device.host_step()
        device.host_fill(host, 0, 4, 1)
    assert device._actions is device and set(vars(device)) == attributes
    assert [item.name for item in program.items] == ["_do_host_step", "_do_fill"]
    with pytest.raises(RuntimeError), device.capture() as program:
        raise RuntimeError("inside the block")
    assert device._actions is device and program.refused == "a call that raised"
