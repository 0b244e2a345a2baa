"""The open scenario language: variant steps, declared streams, pinned buffers from the recycling
pool, host-side waits and queries. Bad use is one line at file:line:col with exit 2; every new
step and stream kind means on the simulated device, and to the detector, what it means to CUDA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import kvcore
from harness.cli import main
from harness.races.detector import Finding, RaceDetector
from harness.errors import ScenarioError
from harness.run.executor import TrialExecutor
from harness.results.outcome import Outcome
from harness.lang.scenario import load_scenario
from kvcore.device.kernels import Delay, Fill

# Line numbers, for reference: 6 streams, 8-9 variants, 11-18 the steps.
BASE = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: lang}
spec:
  pool: {pages: 4}
  streams: {a: non-blocking, b: {kind: blocking, priority: -1}, zero: legacy}
  variants:
    buggy: {expect: reproduces}
    fixed: {expect: clean}
  steps:
    - {id: page, op: materialize, pages: 1}
    - {op: host_alloc, buffer: staging, pages: 2}
    - {op: host_fill, buffer: staging, byte: 1}
    - {id: up, op: copy_from_host, src: staging, dst: page, stream: a}
    - {op: record_event, event: done, stream: a, only: fixed}
    - {op: host_free, buffer: staging, after: done, only: fixed}
    - {op: host_free, buffer: staging, only: buggy}
    - {op: synchronize}
"""
LAST = "    - {op: synchronize}"


def write(tmp_path: Path, old: str = "", new: str = "", name: str = "s.yaml") -> Path:
    assert not old or BASE.count(old) == 1, old
    path = tmp_path / name
    path.write_text(BASE.replace(old, new) if old else BASE, encoding="utf-8")
    return path


def test_base_loads_with_its_streams_and_variant_steps(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path))
    assert [(x.name, x.kind, x.priority) for x in s.streams] == [
        ("a", "non-blocking", 0), ("b", "blocking", -1), ("zero", "legacy", 0)]
    assert [st.op for st in s.steps_of("buggy")] == [
        "materialize", "host_alloc", "host_fill", "copy_from_host", "host_free", "synchronize"]
    assert [st.op for st in s.steps_of("fixed")] == [
        "materialize", "host_alloc", "host_fill", "copy_from_host", "record_event", "host_free",
        "synchronize"]
    assert s.steps[4].only == frozenset({"fixed"}) and s.steps[0].only is None
    assert s.steps[3].origin == f"{tmp_path / 's.yaml'}:14:7"


# What to replace in BASE, with what, and the error after "file:" ({file} is the file).
BAD = {
    "unknown variant in only": (
        "only: fixed}\n    - {op: host_free, buffer: staging, after",
        "only: fixd}\n    - {op: host_free, buffer: staging, after",
        "15:56: spec.steps[4].only: unknown variant 'fixd' (did you mean 'fixed'?); this "
        "scenario's variants are buggy, fixed"),
    "stream not declared": (
        "dst: page, stream: a}", "dst: page, stream: c}",
        "14:69: spec.steps[3].stream: unknown stream 'c'; the declared streams are a, b, zero: "
        "use one, or declare it under spec.streams"),
    "valid in one variant, not another": (
        LAST, "    - {op: wait_event, event: done, stream: b}",
        "18:31: spec.steps[7].event: event 'done' exists in variant fixed (steps[4], "
        "{file}:15:7, makes it) but not in variant buggy, where this step runs too; limit this "
        "step with `only: [fixed]`, or make 'done' in buggy as well"),
    "buffer freed twice": (
        LAST, "    - {op: host_free, buffer: staging}",
        "18:31: spec.steps[7].buffer: buffer 'staging' is freed twice: steps[6] ({file}:17:7) "
        "freed it already in variant buggy; remove one host_free step"),
    "page outside a buffer": (
        "    - {op: host_fill, buffer: staging, byte: 1}",
        "    - {op: host_fill, buffer: staging, byte: 1, page: 2}",
        "13:55: spec.steps[2].page: page 2 is outside buffer 'staging', which has 2 pages "
        "(0..1)"),
    "byte range outside a buffer": (
        "    - {op: host_fill, buffer: staging, byte: 1}",
        "    - {op: host_fill, buffer: staging, byte: 1, offset: 2040, length: 16}",
        "13:57: spec.steps[2].offset: bytes up to 2056 are outside buffer 'staging', which has "
        "2048 bytes (2 pages of 1024)"),
    "world buffer range outside": (
        LAST, "    - {op: host_fill, buffer: w, byte: 1, page: 1}",
        "18:49: spec.steps[7].page: page 1 is outside buffer 'w', which has 1 page (0..0)"),
    "use after free": (
        LAST, "    - {op: host_fill, buffer: staging, byte: 2}",
        "18:31: spec.steps[7].buffer: buffer 'staging' was freed at steps[6] ({file}:17:7) in "
        "variant buggy; it cannot be used after that: allocate it again with host_alloc"),
    "only and unless": (
        "only: buggy}", "only: buggy, unless: fixed}",
        "17:53: spec.steps[6].unless: a step has `only` or `unless`, not both; keep one"),
    "a step that runs nowhere": (
        "only: buggy}", "unless: [buggy, fixed]}",
        "17:48: spec.steps[6].unless: with this, the step runs in no variant; remove the step "
        "or name fewer variants"),
    "two legacy streams": (
        "zero: legacy}", "zero: legacy, zero2: legacy}",
        "6:79: spec.streams.zero2: there is one legacy default stream, and 'zero' is it "
        "already; make this one non-blocking or blocking"),
    "unknown stream kind": (
        "a: non-blocking,", "a: nonblocking,",
        "6:16: spec.streams.a: unknown stream kind 'nonblocking' (did you mean "
        "'non-blocking'?); use one of non-blocking, blocking, legacy"),
    "allocated twice": (
        "    - {op: host_fill, buffer: staging, byte: 1}",
        "    - {op: host_alloc, buffer: staging}",
        "13:32: spec.steps[2].buffer: buffer 'staging' exists already (steps[1], {file}:12:7, "
        "made it); free it with host_free first, or pick another name"),
    "a world buffer freed": (
        LAST, "    - {op: host_fill, buffer: w, byte: 1}\n    - {op: host_free, buffer: w}",
        "19:31: spec.steps[8].buffer: buffer 'w' is a world buffer (steps[7], {file}:18:7, "
        "made it with host_fill); only buffers from host_alloc can be freed"),
    "a variant turns a stream into legacy": (
        "buggy: {expect: reproduces}", "buggy: {expect: reproduces, streams: {zero: blocking}}",
        "8:49: spec.variants.buggy.streams.zero: a variant can make a stream blocking or "
        "non-blocking, not turn it into or out of the legacy stream"),
    "amplify a step one variant lacks": (
        "  steps:", "  amplify: {delay_us: 10, before: fx}\n  steps:\n"
                    "    - {id: fx, op: delay, us: 1, stream: a, only: fixed}",
        "10:35: spec.amplify.before: variant buggy runs no step with id 'fx' (steps[0] runs "
        "only in fixed); amplify a step every variant runs, or give buggy a step with this id"),
    "lease released twice": (
        LAST, "    - {op: release, lease: page}\n    - {op: release, lease: page}",
        "19:28: spec.steps[8].lease: lease 'page' is released twice: steps[7] ({file}:18:7) "
        "released it already; remove one release step"),
    "synchronize on a stream and an event": (
        LAST, "    - {op: synchronize, stream: a, event: done}",
        "18:36: spec.steps[7].event: give stream or event, not both"),
    "ids shared by overlapping variants": (
        LAST, "    - {id: up, op: synchronize, only: buggy}",
        "18:12: spec.steps[7].id: duplicate step id 'up': steps[3] ({file}:14:7) has it too; "
        "both run in variant buggy; rename one, or give them `only:` lists that do not overlap"),
}


@pytest.mark.parametrize(("old", "new", "expected"), BAD.values(), ids=BAD.keys())
def test_bad_use_is_one_line_at_its_place(tmp_path: Path, old: str, new: str,
                                          expected: str) -> None:
    path = write(tmp_path, old, new)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == f"{path}:{expected}".replace("{file}", str(path))


def test_workload_scenarios_keep_the_default_streams(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(BASE.split("  steps:")[0] + "  workload: {kind: conversation}\n")
    with pytest.raises(ScenarioError, match=r"6:3: spec.streams: a workload runs on the "
                                             r"default streams"):
        load_scenario(path)


@pytest.mark.parametrize("case", ["unknown variant in only", "stream not declared",
                                  "valid in one variant, not another", "buffer freed twice",
                                  "page outside a buffer"])
def test_bad_use_exits_2_with_one_line_and_no_traceback(tmp_path: Path, case: str) -> None:
    old, new, expected = BAD[case]
    path = write(tmp_path, old, new)
    result = CliRunner().invoke(main, ["run", str(path), "--backend", "sim"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:{expected.split(':')[0]}:")
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------------------------
# Semantics on the simulated device and in the detector


def _trial(scenario_text: str, tmp_path: Path, variant: str, *, amplify: bool = False,
           seed: int = 1) -> tuple[Outcome, list[Finding], list[kvcore.device.OpRecord]]:
    path = tmp_path / "t.yaml"
    path.write_text(scenario_text, encoding="utf-8")
    scenario = load_scenario(path)
    detector = RaceDetector()
    records: list[kvcore.device.OpRecord] = []

    def watch(device: kvcore.Device) -> None:
        detector.attach(device)
        del records[:]
        device.oplog.subscribe(records.append)

    executor = TrialExecutor(scenario, scenario.variant(variant), "sim", amplify=amplify,
                             on_device=watch)
    result = executor.run(0, seed)
    return result.outcome, detector.findings, records


STREAM_KINDS = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: kinds}
spec:
  pool: {pages: 2}
  streams: {user: non-blocking, default: legacy}
  variants:
    racy: {expect: reproduces}
    blocking: {streams: {user: blocking}, expect: clean}
  amplify: {delay_us: 500, before: write}
  steps:
    - {id: t, op: materialize, pages: 1}
    - {op: host_fill, buffer: data, byte: 0x42}
    - {id: write, op: copy_from_host, src: data, dst: t, stream: user}
    - {id: read, op: copy_to_host, src: t, dst: out, stream: default}
    - {op: synchronize, stream: default}
    - {id: look, op: check, buffer: out, equals: data}
"""


def test_a_blocking_stream_is_ordered_with_legacy_work_and_a_non_blocking_one_is_not(
        tmp_path: Path) -> None:
    racy, findings, _ = _trial(STREAM_KINDS, tmp_path, "racy", amplify=True)
    assert racy is Outcome.CORRUPTION
    assert [(f.first.step, f.second.step) for f in findings] == [("write", "read")]
    blocking, findings, _ = _trial(STREAM_KINDS, tmp_path, "blocking", amplify=True)
    assert blocking is Outcome.CLEAN and findings == []


def test_legacy_work_then_a_blocking_stream_is_ordered_too(tmp_path: Path) -> None:
    text = STREAM_KINDS.replace("stream: user}", "stream: TMP}").replace(
        "stream: default}\n    - {op: synchronize, stream: default}",
        "stream: user}\n    - {op: synchronize}").replace("stream: TMP}", "stream: default}")
    text = text.replace("before: write}", "before: write, stream: default}")
    outcome, findings, _ = _trial(text, tmp_path, "blocking", amplify=True)
    assert outcome is Outcome.CLEAN and findings == []
    outcome, findings, _ = _trial(text, tmp_path, "racy", amplify=True)
    assert outcome is Outcome.CORRUPTION and len(findings) == 1


def test_priorities_change_no_ordering_guarantee(tmp_path: Path) -> None:
    """A high-priority stream races a low-priority one exactly as two plain streams do: the
    same op log, the same findings."""
    plain = STREAM_KINDS.replace("streams: {user: non-blocking, default: legacy}",
                                 "streams: {user: non-blocking, default: non-blocking}")
    prioritised = plain.replace("user: non-blocking,", "user: {kind: non-blocking, "
                                                       "priority: -5},")
    runs = [_trial(text, tmp_path, "racy", amplify=amp)
            for text in (plain, prioritised) for amp in (False, True)]
    for (o1, f1, r1), (o2, f2, r2) in ((runs[0], runs[2]), (runs[1], runs[3])):
        assert o1 is o2
        assert [(f.first.seq, f.second.seq) for f in f1] == [(f.first.seq, f.second.seq)
                                                            for f in f2]
        assert [(r.stream, r.kind, r.t_start_ns) for r in r1] == \
            [(r.stream, r.kind, r.t_start_ns) for r in r2]
    assert runs[1][0] is Outcome.CORRUPTION and runs[1][1]


def _query_program(wait: bool) -> tuple[bool, list[Finding]]:
    device = kvcore.open_device("sim")
    detector = RaceDetector()
    detector.attach(device)
    s = device.create_stream("s")
    dev, pinned = device.alloc(4096, name="dev"), device.alloc_host(4096, name="pinned")
    event = device.create_event("copied")
    device.launch(Delay(100.0), s)
    device.copy(pinned, 0, dev, 0, 4096, s)
    device.record_event(event, s)
    done = device.poll_event(event) > 0 if wait else device.query_event(event)
    device.host_read(pinned, 0, 4096)
    return done, detector.findings


def test_a_query_that_saw_done_orders_the_host_and_one_that_saw_not_ready_does_not() -> None:
    done, findings = _query_program(wait=True)
    assert done and findings == []
    done, findings = _query_program(wait=False)
    assert not done
    [f] = findings
    assert (f.first.kind, f.second.kind) == ("copy_dtoh", "host_read")
    assert "the host's query of event copied at op" in f.missing
    assert "saw it not ready, and the host went on without waiting" in f.missing


def test_a_never_recorded_event_queries_done() -> None:
    device = kvcore.open_device("sim")
    assert device.query_event(device.create_event("never")) is True


def _watched_pool(pages: int = 2, defects: kvcore.Defects = kvcore.Defects()) -> tuple[
        kvcore.Device, RaceDetector, kvcore.DeviceContext, kvcore.DeviceKVPagePool]:
    """A simulated device with a detector on it, a context and a pool of 1 KiB pages."""
    device = kvcore.open_device("sim", defects=defects)
    detector = RaceDetector()
    detector.attach(device)
    ctx = kvcore.DeviceContext(device)
    pool = kvcore.DeviceKVPagePool(ctx, kvcore.KVPageGeometry(
        (kvcore.KVPlaneGeometry(kvcore.DType.I8, 8, 2, 256),), 64), pages)
    return device, detector, ctx, pool


def _pinned_pool(after: bool, delay_us: float,
                 settle: bool = False) -> tuple[int, int, list[Finding]]:
    """A copy from a pinned allocation, the allocation freed (after its event, or at once),
    and the next allocation written by the host (``settle``: once the host's own queries saw
    the copy done, without a synchronize)."""
    device, detector, ctx, pool = _watched_pool()
    layout = kvcore.plan_host_kv_page_layout(pool.geometry)
    arena = kvcore.HostKVArena(ctx, 4 * layout.page_stride, [layout])
    page = pool.materialize(1, name="lease page")
    first = arena.allocate(layout, 1, name="buffer first")
    view = arena.writable_view(first)
    view.fill(0xAB)
    if delay_us:
        device.launch(Delay(delay_us), ctx.stream)
    pool.copy_from_host(view, [page[0].handle], ctx.stream)
    copied = device.create_event("copied")
    device.record_event(copied, ctx.stream)
    arena.free(first, after=(copied,) if after else ())
    while settle and not device.query_event(copied):
        pass
    second = arena.allocate(layout, 1, name="buffer second")
    arena.writable_view(second).fill(0xCD)
    return first.offset, second.offset, detector.findings


def test_a_freed_and_reused_pinned_buffer_keeps_its_past() -> None:
    first, second, findings = _pinned_pool(after=False, delay_us=100.0)
    assert first == second  # the recycling pool handed the same bytes out again
    [f] = findings
    assert (f.first.kind, f.second.kind) == ("copy_htod", "host_write")
    assert f.reused and (f.first_owner, f.owner) == ("buffer first", "buffer second")
    assert "on pinned buffer second (buffer first gave it back and it was handed out again)" \
        in f.missing
    assert "host_free after: the event, as a caching host allocator does" in f.missing
    # Freed at once but written only after the copy: the same bytes, and no race.
    first, second, findings = _pinned_pool(after=False, delay_us=0.0, settle=True)
    assert first == second and findings == []


def test_a_deferred_free_hands_the_bytes_out_only_once_a_query_sees_the_copy_done() -> None:
    first, second, findings = _pinned_pool(after=True, delay_us=100.0)
    assert first != second and findings == []  # still copying: other bytes
    first, second, findings = _pinned_pool(after=True, delay_us=100.0, settle=True)
    assert first == second and findings == []  # done: the same bytes, ordered by the query


def test_variant_only_steps_change_the_op_log_only_in_their_variant(tmp_path: Path) -> None:
    text = BASE.replace(LAST, "    - {op: synchronize}\n    - {id: look, op: check, lease: "
                              "page, byte: 1}")
    _, _, buggy = _trial(text, tmp_path, "buggy")
    _, _, fixed = _trial(text, tmp_path, "fixed")

    def by_step(records: list, steps: set[str]) -> list[tuple[str, str, str]]:
        return [(r.stream, r.kind, r.step) for r in records if r.step in steps]

    common = {"page", "1:host_alloc", "2:host_fill", "up", "7:synchronize", "look"}
    assert by_step(buggy, common) == by_step(fixed, common)
    assert [k for _, k, _ in by_step(fixed, {"4:record_event", "5:host_free"})] == [
        "event_record", "free"]
    assert by_step(buggy, {"4:record_event", "5:host_free"}) == []
    assert [k for _, k, _ in by_step(buggy, {"6:host_free"})] == ["free"]
    assert by_step(fixed, {"6:host_free"}) == []
    # Without variant-only steps, both variants give the same op log.
    same = text.replace(", only: fixed}", "}").replace(
        "    - {op: host_free, buffer: staging, only: buggy}\n", "")
    _, _, a = _trial(same, tmp_path, "buggy")
    _, _, b = _trial(same, tmp_path, "fixed")
    assert [(r.stream, r.kind, r.step) for r in a] == [(r.stream, r.kind, r.step) for r in b]


def test_steps_name_their_scenario_line_in_the_op_log(tmp_path: Path) -> None:
    _, _, records = _trial(BASE, tmp_path, "fixed")
    copy = next(r for r in records if r.kind == "copy_htod" and r.step == "up")
    assert copy.stream == "a"
    assert copy.detail["origin"] == f"{tmp_path / 't.yaml'}:14:7"


def test_host_fill_of_some_pages_and_of_a_byte_range(tmp_path: Path) -> None:
    text = BASE.replace(LAST, "    - {op: host_alloc, buffer: two, pages: 2}\n"
                              "    - {op: host_fill, buffer: two, byte: 7, page: [1]}\n"
                              "    - {op: host_fill, buffer: two, byte: 9, offset: 8, "
                              "length: 4}\n    - {op: synchronize}")
    _, _, records = _trial(text, tmp_path, "buggy")
    fills = [r for r in records if r.kind == "host_write" and r.detail
             and r.detail.get("value") in (7, 9)]
    [(b1, off1, n1)] = fills[0].writes
    [(b2, off2, n2)] = fills[1].writes
    assert (n1, n2) == (1024, 4) and off1 - off2 == 1024 - 8 and b1 == b2


def test_table_shadow_wait_is_a_defect_switch() -> None:
    """Two publishes of one row: the second rewrites the pinned shadow row. With the wait (the
    default) it waits for the first copy to have read it; without, it races that copy."""
    def publish_twice(defects: kvcore.Defects) -> list[Finding]:
        device, detector, ctx, pool = _watched_pool(4, defects)
        table = kvcore.KVExecutionTablePool(pool, 2, 4)
        catalog = kvcore.KVConversationCatalog(table, "conv")
        catalog.retain(pool.materialize(2))
        catalog.bind()
        device.launch(Delay(200.0), ctx.stream)
        catalog.activate(ctx.stream)
        catalog.activate(ctx.stream)
        return detector.findings

    assert publish_twice(kvcore.Defects()) == []
    [f] = publish_twice(kvcore.Defects(table_shadow_wait=False))
    assert f.buffer == "exec-table-shadow" and f.owner == "row of catalog conv"
    assert (f.first.kind, f.second.kind) == ("copy_htod", "host_write")
    assert "before the host rewrites the buffer" in f.missing


def test_a_page_raced_without_release_is_not_called_reuse() -> None:
    device, detector, ctx, pool = _watched_pool()
    [lease] = pool.materialize(1, name="lease kv")
    offset = pool.page_offset(lease.handle)
    device.launch(Fill(pool.buffer, offset, 64, 1), ctx.transfer_stream)
    device.launch(Fill(pool.buffer, offset, 64, 2), ctx.stream)
    [f] = detector.findings
    assert not f.reused and f.owner == "lease kv"
    assert "reuse" not in f.missing and "handed out" not in f.missing
    assert f.missing.endswith("record an event on transfer_stream after op 2 and make stream "
                              "wait on it before op 3")


STALE = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: stale}
spec:
  pool: {pages: 2}
  streams: {producer: non-blocking, consumer: non-blocking}
  variants:
    buggy: {expect: reproduces}
  steps:
    - {id: page, op: materialize, pages: 1}
    - {id: out, op: materialize, pages: 1}
    - {op: host_fill, buffer: data, byte: 1}
    - {id: first-record, op: record_event, event: ready, stream: producer}
    - {id: wait-ready, op: wait_event, event: ready, stream: consumer}
    - {id: produce, op: copy_from_host, src: data, dst: page, stream: producer}
    - {id: record-ready, op: record_event, event: ready, stream: producer}
    - {id: consume, op: copy_page, src: page, dst: out, stream: consumer}
    - {op: synchronize}
"""


def test_a_wait_on_a_stale_record_is_explained(tmp_path: Path) -> None:
    _, [f], _ = _trial(STALE, tmp_path, "buggy")
    assert f.missing == (
        "nothing orders producer's write (copy_htod at step produce) before consumer's read "
        "(copy_dtod at step consume) on kv-arena page 0 (lease page): the wait at wait-ready "
        "used an earlier record of event ready; the record that covers produce came after it "
        "(at record-ready): wait on ready only once that record is issued, or record it before "
        "the wait")
    assert f.first.origin.endswith("t.yaml:15:7") and f.second.origin.endswith("t.yaml:17:7")


def test_offline_check_names_owners_as_the_online_detector_does(tmp_path: Path) -> None:
    """A trace begins with who owned which bytes (label records: a world's buffers outlive its
    trials), then says every alloc and free: `gpurace check` names and explains the race as
    the online detector did."""
    from harness.races.detector import check_trace
    from harness.traces.flight import FlightRecorder
    from harness.traces.optrace import load_trace

    device, online, ctx, pool = _watched_pool(defects=kvcore.Defects(release_fence=False))
    recorder = FlightRecorder(tmp_path)
    recorder.attach(device)
    kept = pool.materialize(1, name="lease world")  # owned before the trace starts
    recorder.start_trial({"scenario": "owners", "variant": "buggy"})
    online.reset()
    device.oplog.step = "reuse"  # two steps, so the two races do not fold into one finding
    old = pool.materialize(1, name="lease old")
    offset = pool.page_offset(old[0].handle)
    device.launch(Delay(50.0), ctx.transfer_stream)
    device.launch(Fill(pool.buffer, offset, 64, 1), ctx.transfer_stream)
    pool.release(old)
    new = pool.materialize(1, name="lease new")
    device.launch(Fill(pool.buffer, pool.page_offset(new[0].handle), 64, 2), ctx.stream)
    device.oplog.step = "world"
    device.launch(Fill(pool.buffer, pool.page_offset(kept[0].handle), 64, 3),
                  ctx.transfer_stream)
    device.launch(Fill(pool.buffer, pool.page_offset(kept[0].handle), 64, 4), ctx.stream)
    path = recorder.end_trial(0, keep=True)
    trace = load_trace(path)
    assert any(r["type"] == "label" and r["name"] == "lease world" for r in trace.records)
    offline = check_trace(trace.records).findings
    assert [f.missing for f in offline] == [f.missing for f in online.findings]
    reused, world = sorted(offline, key=lambda f: not f.reused)
    assert reused.reused and (reused.first_owner, reused.owner) == ("lease old", "lease new")
    assert not world.reused and world.owner == "lease world"


def test_gpurace_steps_lists_the_whole_vocabulary() -> None:
    from harness.lang.vocabulary import OPS

    result = CliRunner().invoke(main, ["steps", "--format", "json"])
    assert result.exit_code == 0
    listed = json.loads(result.stdout)
    assert list(listed) == list(OPS)
    assert listed["host_free"]["keys"] == {
        "buffer": {"holds": "a pinned buffer", "required": True},
        "after": {"holds": "an event or a list", "required": False}}
    text = CliRunner().invoke(main, ["steps"]).output
    assert all(op in text for op in OPS)


def test_a_scrubbed_world_starts_each_trial_from_a_byte_no_step_uses(tmp_path: Path) -> None:
    """On the GPU one world serves every trial of a worker, so its pages would still hold the
    last trial's bytes; it fills them with a byte no step uses at its start and after every
    trial instead. Shown on the simulated device, with a world that serves two trials."""
    from harness.run.steps import _Steps
    from harness.run.world import World

    scenario = load_scenario(write(tmp_path))
    variant = scenario.variant("buggy")
    executor = TrialExecutor(scenario, variant, "sim")
    device = kvcore.open_device("sim")
    detector = RaceDetector()
    detector.attach(device)
    world = World(scenario, device, variant, scrubs=True)

    def untouched_page() -> set[int]:
        host = device.alloc_host(world.pool.page_stride, name="look")
        device.copy(host, 0, world.pool.buffer, 3 * world.pool.page_stride, host.nbytes,
                    world.check_stream)
        device.synchronize()
        return set(device.host_read(host, 0, host.nbytes).tolist())

    assert untouched_page() == {2}  # BASE writes byte 1 only: 2 is the first free one
    for expected in (3, 4):
        detector.reset()
        assert _Steps(executor, world).run()[0] is Outcome.CLEAN
        assert detector.findings == []
        assert untouched_page() == {expected}  # another byte after every trial


def test_a_poisoned_world_that_serves_many_trials_scrubs_after_the_poison(tmp_path: Path) -> None:
    """The poison of a trial's last releases runs on the pool's own stream; the scrub that ends
    the trial on the GPU writes the same pages, so it waits for the poison first: the fixed
    variant stays race-free however many trials its world serves (shown on sim)."""
    from harness.run.steps import _Steps
    from harness.run.world import World
    from harness.lang.targets import SCENARIO_ROOT

    scenario = load_scenario(SCENARIO_ROOT / "release_fence.yaml")
    variant = scenario.variant("fixed")
    executor = TrialExecutor(scenario, variant, "sim", poison=0xEE)
    device = kvcore.open_device("sim")
    detector = RaceDetector()
    detector.attach(device)
    world = World(scenario, device, variant, scrubs=True, poison=0xEE)
    for _ in range(3):
        detector.reset()
        assert _Steps(executor, world).run()[0] is Outcome.CLEAN
        assert detector.findings == []
