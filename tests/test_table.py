"""Execution table, catalog activation, and the #210 legacy-stream publish race."""

from __future__ import annotations

import os

import pytest

import kvcore
from conftest import make_device
from programs import (
    healthy_kernel_program,
    in_worker,
    legacy_publish_trials,
    table_assert_program,
)

LEGACY_TRIALS = {"sim": 100, "cuda": 200}


def test_table_reader_assert_kills_sim_context() -> None:
    out = table_assert_program("sim")
    assert out["fault"] == "CUDA_ERROR_ASSERT"
    assert "kernels.cu:132" in out["message"]
    assert out["dead_after"]


@pytest.mark.gpu
def test_table_reader_assert_caught_in_worker_parent_alive() -> None:
    parent = os.getpid()
    out = in_worker(table_assert_program, "cuda")
    assert out["fault"] == "CUDA_ERROR_ASSERT", out
    assert out["dead_after"], "the CUDA context kept working after a device-side assert"
    assert os.getpid() == parent
    # The GPU (and a new context) is fine afterwards.
    assert in_worker(healthy_kernel_program, "cuda")


@pytest.mark.parametrize("delay_us", [500.0, 1000.0])
def test_legacy_publish_race_reproduces_amplified(
    backend: str, request: pytest.FixtureRequest, delay_us: float
) -> None:
    trials = LEGACY_TRIALS[backend]
    device = make_device(backend, request, kvcore.Defects(publish_on_legacy_stream=True))
    manifested = legacy_publish_trials(device, trials, delay_us)
    print(f"\nlegacy publish race on {backend}, {delay_us} us on the legacy stream: "
          f"{manifested}/{trials} trials read stale entries")
    assert manifested >= 0.95 * trials


@pytest.mark.parametrize("delay_us", [0.0, 500.0, 1000.0])
def test_publish_on_callers_stream_never_races(
    backend: str, request: pytest.FixtureRequest, delay_us: float
) -> None:
    trials = LEGACY_TRIALS[backend]
    device = make_device(backend, request, kvcore.Defects())
    assert legacy_publish_trials(device, trials, delay_us) == 0


def test_legacy_publish_race_unamplified_rate(backend: str,
                                              request: pytest.FixtureRequest) -> None:
    """Unamplified, the legacy copy of a small row landed before the reader 200/200 times on
    the H200 here; the simulator is calibrated to agree. The figure is printed for the log."""
    trials = LEGACY_TRIALS[backend]
    device = make_device(backend, request, kvcore.Defects(publish_on_legacy_stream=True))
    manifested = legacy_publish_trials(device, trials)
    print(f"\nlegacy publish race on {backend}, unamplified: {manifested}/{trials}")
    if backend == "sim":
        assert manifested <= 0.05 * trials


def _row_world(backend: str, request: pytest.FixtureRequest):
    from kvcore import DeviceContext, DeviceKVPagePool, KVExecutionTablePool
    from programs import SMALL_GEOMETRY

    device = make_device(backend, request)
    context = DeviceContext(device)
    pool = DeviceKVPagePool(context, SMALL_GEOMETRY, 4)
    table = KVExecutionTablePool(pool, rows=2, max_pages_per_row=4)
    leases = pool.materialize(4)
    pool.zero_pages([lease.handle for lease in leases], context.stream)
    row = table.acquire(name="conv")
    return device, context, pool, table, leases, row


def _page(device, context, pool, index: int) -> set[int]:
    host = device.alloc_host(pool.page_stride, name=f"page-{index}-back")
    device.copy(host, 0, pool.buffer, index * pool.page_stride, pool.page_stride, context.stream)
    context.synchronize()
    return set(device.host_read(host, 0, pool.page_stride).tolist())


def test_kv_write_and_attention_follow_the_row(backend: str,
                                               request: pytest.FixtureRequest) -> None:
    """kv_write writes the pages the row names and no other; attention counts the bytes of
    those pages that are not the owner's."""
    import numpy as np

    device, context, pool, table, leases, row = _row_world(backend, request)
    table.publish(row, [leases[1].handle, leases[3].handle], context.stream)
    table.write_pages(row, 2, 0x33, context.stream)
    result = device.alloc(8, name="counts")
    device.memset(result, 0, 8, 0, context.stream)
    table.attend(row, 2, 0x33, context.stream, result=result, assert_on_mismatch=False)
    table.attend(row, 2, 0x44, context.stream, result=result, result_offset=4,
                 assert_on_mismatch=False)
    host = device.alloc_host(8, name="counts-host")
    device.copy(host, 0, result, 0, 8, context.stream)
    context.synchronize()
    assert [_page(device, context, pool, i) for i in range(4)] == [{0}, {0x33}, {0}, {0x33}]
    assert device.host_read(host, 0, 8).view(np.int32).tolist() == [0, 2 * pool.page_stride]


def test_kv_write_follows_a_stale_row_and_the_detector_finds_the_row_race(
        backend: str, request: pytest.FixtureRequest) -> None:
    """Data-dependent addresses: the row is republished on one stream behind 2 ms of work and
    kv_write runs at once on another; it follows the old row, into the old page, on both
    backends. The op log records the page the host last published, and the detector finds the
    race on the row itself."""
    from harness.races.detector import RaceDetector
    from kvcore.device.kernels import Delay

    device, context, pool, table, leases, row = _row_world(backend, request)
    detector = RaceDetector()
    detector.attach(device)
    table.publish(row, [leases[0].handle], context.stream)
    context.synchronize()
    device.launch(Delay(2000), context.transfer_stream)
    table.publish(row, [leases[2].handle], context.transfer_stream)
    table.write_pages(row, 1, 0x5A, context.stream)
    context.synchronize()
    assert _page(device, context, pool, 0) == {0x5A}  # where the old row pointed
    assert _page(device, context, pool, 2) == {0}
    races = [(f.buffer, f.first.kind, f.second.kind) for f in detector.findings]
    assert any(buffer == "exec-table" and "kernel:kv_write" in (first, second)
               for buffer, first, second in races), races


def _oplog(device) -> list[tuple]:
    """What the op log says each kernel read and wrote: (kind, stream, reads, writes)."""
    out = []
    device.oplog.subscribe(lambda r: out.append(
        (r.kind, r.stream, [(a.buffer, a.offset, a.length) for a in r.reads],
         [(a.buffer, a.offset, a.length) for a in r.writes])) if r.kind.startswith("kernel:")
        else None)
    return out


def test_gather_and_scatter_follow_a_pinned_page_list(backend: str,
                                                      request: pytest.FixtureRequest) -> None:
    """A page list in pinned memory, read in place by the kernels: scatter writes packed pages
    into the pages it names, gather copies them back out, kv_write and attention follow it too;
    the op log says which pages each touched, the same on both backends."""
    import numpy as np

    from kvcore import PageIndex
    from kvcore.device.kernels import first_mismatch

    device, context, pool, _table, leases, _row = _row_world(backend, request)
    stride = pool.page_stride
    staging = device.alloc_host(4 * stride + 64, name="page-list")
    listing = PageIndex(pool, staging, 0, 64)
    packed = device.alloc_host(2 * stride, name="packed")
    device.host_fill(packed, 0, stride, 0x11)
    device.host_fill(packed, stride, stride, 0x22)
    log = _oplog(device)
    listing.write([leases[3].handle, leases[1].handle])
    listing.scatter(packed, 0, context.stream)
    context.synchronize()
    assert [_page(device, context, pool, i) for i in range(4)] == [{0}, {0x22}, {0}, {0x11}]
    back = device.alloc_host(2 * stride, name="back")
    listing.gather(back, 0, context.stream)
    result = device.alloc(4, name="count")
    first = device.alloc(8, name="first")
    device.memset(result, 0, 4, 0, context.stream)
    device.memset(first, 0, 8, 0xFF, context.stream)
    listing.attend(0x11, context.stream, result=result, assert_on_mismatch=False, first=first)
    context.synchronize()  # before the host rewrites the list: the kernels read it in place
    listing.write([leases[2].handle])
    listing.write_pages(0x33, context.stream)
    context.synchronize()
    assert set(device.host_read(back, 0, stride).tolist()) == {0x11}
    assert set(device.host_read(back, stride, stride).tolist()) == {0x22}
    assert _page(device, context, pool, 2) == {0x33}
    count = device.alloc_host(12, name="count-host")
    device.copy(count, 0, result, 0, 4, context.stream)
    device.copy(count, 4, first, 0, 8, context.stream)
    context.synchronize()
    assert device.host_read(count, 0, 4).view(np.int32).tolist() == [stride]  # page 1's bytes
    # The first page it found wrong: entry 1 of the list, page 1, holding 0x22.
    assert first_mismatch(int(device.host_read(count, 4, 8).view(np.uint64)[0])) == (1, 1, 0x22)
    kernels = [(kind, reads, writes) for kind, _, reads, writes in log]
    p, s, b = pool.buffer.id, staging.id, back.id
    assert kernels == [
        ("kernel:scatter_pages", [(s, 0, 16), (packed.id, 0, 2 * stride)],
         [(p, stride, stride), (p, 3 * stride, stride)]),
        ("kernel:gather_pages", [(s, 0, 16), (p, stride, stride), (p, 3 * stride, stride)],
         [(b, 0, 2 * stride)]),
        ("kernel:attention", [(s, 0, 16), (p, stride, stride), (p, 3 * stride, stride),
                              (result.id, 0, 4), (first.id, 0, 8)],
         [(result.id, 0, 4), (first.id, 0, 8)]),
        ("kernel:kv_write", [(s, 0, 8)], [(p, 2 * stride, stride)]),
    ]


def test_a_page_list_rewritten_in_place_sends_a_queued_kernel_elsewhere(
        backend: str, request: pytest.FixtureRequest) -> None:
    """Data-dependent addresses through pinned memory: kv_write is queued behind 2 ms of work
    following a list of page 0, and the host rewrites the list in place for page 2 before it
    runs. It writes page 2 on both backends; the op log records page 0 (what the list held at
    the launch) and the detector finds the race on the list's own bytes."""
    from harness.races.detector import RaceDetector
    from kvcore import PageIndex
    from kvcore.device.kernels import Delay

    device, context, pool, _table, leases, _row = _row_world(backend, request)
    detector = RaceDetector()
    detector.attach(device)
    staging = device.alloc_host(64, name="page-list")
    listing = PageIndex(pool, staging, 0, 64)
    listing.write([leases[0].handle])
    device.launch(Delay(2000), context.stream)
    listing.write_pages(0x5A, context.stream)
    listing.write([leases[2].handle])  # the next batch's list, in place
    context.synchronize()
    assert _page(device, context, pool, 0) == {0}
    assert _page(device, context, pool, 2) == {0x5A}
    races = [(f.buffer, f.first.kind, f.second.kind) for f in detector.findings]
    assert ("page-list", "kernel:kv_write", "host_write") in races, races


def test_attention_asserts_on_another_owners_bytes_on_sim(
        request: pytest.FixtureRequest) -> None:
    device, context, _, table, leases, row = _row_world("sim", request)
    table.publish(row, [leases[0].handle], context.stream)  # a zeroed page
    result = device.alloc(4, name="count")
    table.attend(row, 1, 0x11, context.stream, result=result)
    with pytest.raises(kvcore.DeviceFaultError, match="kernels_data.cu:17: attention: page 0"):
        context.synchronize()


def test_kernel_steps_in_a_scenario(tmp_path) -> None:
    """kv_write and attention as steps: attention of the owner's bytes counts nothing; a check
    that finds kv_write's bytes says whose table row wrote them."""
    from harness.run.executor import TrialExecutor
    from harness.lang.scenario import load_scenario

    text = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: kernels}
spec:
  pool: {pages: 4, page_tokens: 64, planes: [{dtype: i8, leading: 8, heads: 2, align: 256}]}
  variants: {fixed: {expect: clean}, wrong: {expect: reproduces}}
  steps:
    - {id: kv, op: materialize, pages: 2}
    - {id: conv, op: catalog}
    - {op: retain, catalog: conv, lease: kv}
    - {op: bind, catalog: conv}
    - {op: activate, catalog: conv, stream: compute}
    - {id: write-tokens, op: kv_write, catalog: conv, byte: 0xAA, stream: compute}
    - {id: decode, op: attention, catalog: conv, byte: 0xAA, stream: compute, assert: false}
    - {id: decode-wrong, op: attention, catalog: conv, byte: 0xBB, stream: compute,
       assert: false, only: wrong}
    - {op: synchronize}
    - {op: check, lease: kv, byte: 0xAA}
"""
    path = tmp_path / "kernels.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    fixed = TrialExecutor(scenario, scenario.variant("fixed"), "sim").run(0, 0)
    assert fixed.outcome.value == "clean", fixed.detail
    wrong = TrialExecutor(scenario, scenario.variant("wrong"), "sim").run(0, 0)
    assert wrong.detail == (
        "decode-wrong: attention through catalog conv's table row read 2048 bytes that are not "
        "0xBB in the pages it names: another owner's data; entry 0 named page 0 (lease kv's "
        "page), which held 0xAA (written through catalog conv's table row at write-tokens)")
    path.write_text(text.replace("{op: check, lease: kv, byte: 0xAA}",
                                 "{op: check, lease: kv, byte: 0xCC}"))
    scenario = load_scenario(path)
    result = TrialExecutor(scenario, scenario.variant("fixed"), "sim").run(0, 0)
    assert result.detail.endswith(
        "found 0xAA (written through catalog conv's table row at write-tokens)")


@pytest.mark.parametrize("backend_name", ["sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_stale_indices_make_kv_write_scatter_into_another_requests_page(
        tmp_path, backend_name: str) -> None:
    """The acceptance of kernels on the data: a reused table row, republished on the legacy
    stream, sends request C's KV write into request B's page; the detail names both. Amplified,
    the buggy variant manifests in at least 95% of trials and the fixed one never; unamplified,
    the detector finds it on trial 1."""
    import json

    from click.testing import CliRunner

    from harness.cli import main
    from harness.lang.targets import SCENARIO_ROOT

    def run(*args: str) -> dict[str, dict]:
        result = CliRunner().invoke(main, [
            "run", str(SCENARIO_ROOT / "stale_row_write.yaml"), "--backend", backend_name,
            "--format", "json", "--out", str(tmp_path), "--insist", *args])
        assert result.exit_code in (0, 1), result.output
        return {r["variant"]: r for r in json.loads(result.stdout)["results"]}

    amplified = run("--trials", "50")
    buggy, fixed = amplified["buggy"], amplified["fixed"]
    print(f"\nstale-row-write on {backend_name}: buggy {buggy['manifested']}/50, "
          f"fixed {fixed['manifested']}/50")
    assert buggy["manifested"] >= 0.95 * 50
    assert buggy["first_manifested"]["detail"].startswith("b-intact: lease b-page: page 0:")
    assert buggy["first_manifested"]["detail"].endswith(
        "found 0xCC (written through catalog c's table row at c-writes)")
    assert (fixed["manifested"], fixed["detected"]) == (0, 0)
    first = run("--trials", "1", "--no-amplify", "--variant", "buggy")["buggy"]
    assert first["detected"] == 1


def test_release_catalog_gives_its_pages_and_rows_back(tmp_path) -> None:
    from harness.errors import ScenarioError
    from harness.lang.scenario import load_scenario

    head = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: ended}
spec:
  pool: {pages: 1, page_tokens: 64, planes: [{dtype: i8, leading: 8, heads: 2, align: 256}],
         table_rows: 1}
  variants: {fixed: {expect: clean}}
  steps:
    - {id: p, op: materialize, pages: 1}
    - {id: c, op: catalog}
    - {op: retain, catalog: c, lease: p}
    - {op: bind, catalog: c}
"""
    path = tmp_path / "ended.yaml"
    # Its page and its row are free again: the one page and the one row can be taken anew.
    path.write_text(head + "    - {op: release_catalog, catalog: c}\n"
                           "    - {id: q, op: materialize, pages: 1}\n"
                           "    - {id: d, op: catalog}\n    - {op: bind, catalog: d}\n")
    load_scenario(path)
    for extra, message in (
            ("    - {op: release_catalog, catalog: c}\n"
             "    - {op: zero_pages, lease: p, stream: compute}\n",
             "lease 'p' was released at steps[4]"),
            ("    - {op: release, lease: p}\n    - {op: release_catalog, catalog: c}\n",
             "catalog 'c' retains lease 'p', released at steps[4]"),
            ("    - {op: release_catalog, catalog: c}\n    - {op: bind, catalog: c}\n",
             "catalog 'c' was released at steps[4]"),
    ):
        path.write_text(head + extra)
        with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
            load_scenario(path)


def test_a_kernel_reads_pinned_memory_in_place(backend: str, request, tmp_path) -> None:
    """Zero-copy: a kernel queued behind 2 ms of work reads a pinned buffer in place; the host
    rewrites it meanwhile, and the kernel sees the new bytes (on both backends). The fix, a
    synchronize before the rewrite, keeps it clean, and the detector agrees."""
    from harness.races.detector import RaceDetector
    from harness.run.executor import TrialExecutor
    from harness.lang.scenario import load_scenario

    path = tmp_path / "zero_copy.yaml"
    path.write_text("""\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: zero-copy}
spec:
  pool: {pages: 2, page_tokens: 64, planes: [{dtype: i8, leading: 8, heads: 2, align: 256}]}
  variants: {buggy: {expect: reproduces}, fixed: {expect: clean}}
  steps:
    - {op: host_fill, buffer: input, byte: 0x11}
    - {op: delay, us: 2000, stream: compute}
    - {id: in-place, op: read_pinned, buffer: input, byte: 0x11, stream: compute}
    - {op: synchronize, stream: compute, only: fixed}
    - {id: next-input, op: host_fill, buffer: input, byte: 0x22}
    - {op: synchronize}
""")
    scenario = load_scenario(path)
    outcomes = {}
    for name in ("buggy", "fixed"):
        detector = RaceDetector()
        result = TrialExecutor(scenario, scenario.variant(name), backend,
                               on_device=detector.attach).run(0, 0)
        outcomes[name] = (result.outcome.value, result.detail, len(detector.findings))
    assert outcomes["buggy"] == (
        "corruption", "in-place: a kernel reading buffer input in place saw 1024 bytes that are "
        "not 0x11: the host changed them under it", 1)
    assert outcomes["fixed"] == ("clean", "", 0)


PAGE_LIST = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: lists}
spec:
  pool: {pages: 4, page_tokens: 64, planes: [{dtype: i8, leading: 8, heads: 2, align: 256}]}
  variants: {fixed: {expect: clean}}
  steps:
    - {id: kv, op: materialize, pages: 2}
    - {op: host_fill, buffer: tokens, byte: 0x5A, pages: 2}
    - {op: page_list, buffer: blocks, lease: kv}
    - {op: scatter, page_list: blocks, from: tokens, stream: compute}
    - {op: gather, page_list: blocks, to: back, stream: compute}
    - {op: kv_write, page_list: blocks, byte: 0x6B, stream: compute}
    - {op: synchronize}
    - {op: check, buffer: back, equals: tokens}
    - {op: check, lease: kv, byte: 0x6C}
"""


def test_page_list_steps_run_and_say_whose_bytes(tmp_path) -> None:
    """scatter, gather and kv_write through a page list as steps; a check that finds the
    kv_write's bytes names the page list."""
    from harness.run.executor import TrialExecutor
    from harness.lang.scenario import load_scenario

    path = tmp_path / "lists.yaml"
    path.write_text(PAGE_LIST)
    scenario = load_scenario(path)
    result = TrialExecutor(scenario, scenario.variant("fixed"), "sim").run(0, 0)
    assert result.outcome.value == "corruption"  # the gathered copy matched; the lease did not
    assert result.detail.startswith("8:check: lease kv: page 0: ")
    assert result.detail.endswith("found 0x6B (written through page list blocks at 5:kv_write)")


@pytest.mark.parametrize("old, new, says", [
    ("{op: page_list, buffer: blocks, lease: kv}", "{op: host_fill, buffer: blocks, byte: 1}",
     "buffer 'blocks' holds no page list when this scatter runs: write one into it first"),
    ("{op: kv_write, page_list: blocks,", "{op: kv_write, catalog: blocks, page_list: blocks,",
     "catalog (its table row) or page_list (a page list, pinned or copied into a lease), to "
     "follow"),
    ("{op: host_fill, buffer: tokens, byte: 0x5A, pages: 2}",
     "{op: host_alloc, buffer: tokens, pages: 1}",
     "page list 'blocks' has 2 entries, a page each"),
])
def test_page_list_mistakes_are_refused_at_the_step(tmp_path, old: str, new: str,
                                                     says: str) -> None:
    from harness.errors import ScenarioError
    from harness.lang.scenario import load_scenario

    assert old in PAGE_LIST
    path = tmp_path / "lists.yaml"
    path.write_text(PAGE_LIST.replace(old, new))
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert says in str(caught.value), str(caught.value)
