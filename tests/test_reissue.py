"""Device programs: calls captured once and issued again (kvcore), and the executor's reissued
trials against trials run step by step: the same outcomes, details and op records."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import kvcore
from conftest import make_device
from harness.executor import TrialExecutor, reissuable
from harness.model import PlaneSpec, PoolSpec
from harness.outcome import Outcome, TrialResult
from harness.scenario import load_scenario
from harness.targets import SCENARIO_ROOT, resolve_targets
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


def test_the_reissued_cases_cover_the_catalog_and_the_zoo() -> None:
    names = {load_scenario(path).name for path, _ in CASES}
    assert {"cross-stream-race", "release-fence", "store-before-write", "pytorch-2702",
            "vllm-36013"} <= names


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
    from then on."""
    for path, variant in CASES:
        reissued, _ = _same_trials(path, variant, 12, amplify=amplify)
        if load_scenario(path).variant(variant).expect == "clean":
            assert reissued == 10, (path, variant)


@pytest.mark.parametrize("name", ["cross_stream_race", "release_fence"])
def test_a_reissued_trial_that_fails_a_check_ends_as_the_step_path_does(name: str) -> None:
    """A delay at the edge of the race window (250 us on sim) makes some trials clean and some
    corrupt: a reissued trial that fails a check skips the checks after it (release-fence has
    two), synchronizes and cleans up as the step path does, and the next trial is right."""
    _, reissued = _same_trials(str(SCENARIO_ROOT / f"{name}.yaml"), "buggy", 30, amplify=True,
                               delay_us=250.0)
    assert Outcome.CORRUPTION in reissued and Outcome.CLEAN in reissued


def test_the_scrub_rides_only_on_the_last_read_of_the_pool() -> None:
    """The check whose wait may cover the trial's scrub: the last to read the pool, on the
    scenario's own thread, with only checks of buffers after it."""
    from harness.executor import _last_pool_read
    from harness.model import Step

    def check(thread: str | None = None, **args: object) -> Step:
        return Step("check", dict(args), thread=thread)

    lease, buffer = check(lease="a"), check(buffer="b", byte=1)
    assert _last_pool_read((Step("synchronize", {}), lease, buffer)) is lease
    assert _last_pool_read((lease, check("t", lease="b"))) is None  # a thread reads after it
    assert _last_pool_read((lease, Step("release", {"lease": "a"}))) is None
    assert _last_pool_read((buffer,)) is None
