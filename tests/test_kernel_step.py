"""`op: kernel` (#30): a kernel of the program's own on any lease or pinned buffer, on the
simulated device and in the race detector, and the loader's words for one that is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.races.detector import check_trace
from harness.errors import ScenarioError
from harness.analyses.minimize import _closure
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.scenario import load_scenario
from harness.traces.optrace import load_trace

HEAD = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: kernels, description: kernels on leases and buffers}
spec:
  pool: {pages: 16, page_tokens: 64, planes: [{dtype: i8, leading: 8, heads: 2, align: 256}]}
  streams: {compute: non-blocking, offload: non-blocking}
  trials: 20
  variants:
    buggy: {expect: reproduces, min_rate: 0.9}
    fixed: {expect: clean}
  steps:
"""

FORWARD_OFFLOAD = HEAD + """\
    - {id: block, op: materialize, pages: 2}
    - {op: host_fill, buffer: expected, byte: 0x22, pages: 2}
    - {op: host_fill, buffer: inputs, byte: 0x01}
    - {id: forward, op: kernel, stream: compute, reads: inputs, writes: block, byte: 0x22, us: 200}
    - {op: record_event, event: written, stream: compute, only: fixed}
    - {op: wait_event, event: written, stream: offload, only: fixed}
    - {id: offload, op: copy_to_host, src: block, dst: stored, stream: offload}
    - {op: synchronize}
    - {op: check, buffer: stored, equals: expected}
"""


def _run(tmp_path: Path, text: str, trials: int = 20) -> dict[str, object]:
    path = tmp_path / "kernels.yaml"
    path.write_text(text)
    result = Runner(RunOptions(backend="sim", trials=trials, out_dir=tmp_path / "out")).run(
        [load_scenario(path)])
    return {r.variant: r for r in result.results}


def test_a_kernels_write_read_by_another_stream_races_and_an_event_orders_it(tmp_path):
    got = _run(tmp_path, FORWARD_OFFLOAD)
    buggy, fixed = got["buggy"], got["fixed"]
    assert buggy.manifested == buggy.trials == 20 and buggy.detected == 20
    assert fixed.manifested == 0 and fixed.detected == 0
    (finding,) = buggy.finding_summary(1)
    assert finding["first"]["kind"] == "kernel:forward" and finding["first"]["step"] == "forward"
    assert finding["missing"].startswith(
        "nothing orders compute's write (kernel:forward at step forward) before offload's read "
        "(copy_dtoh at step offload) on kv-arena page 0 (lease block); record an event on "
        "compute after forward and make offload wait on it before offload")
    # The stored bytes were copied out before the kernel's landed, and the check says so.
    assert buggy.first_manifested is not None
    assert "stored" in buggy.first_manifested.detail


def test_a_kernel_reading_pinned_memory_the_host_rewrites_races(tmp_path):
    text = HEAD + """\
    - {id: out, op: materialize, pages: 1}
    - {op: host_fill, buffer: inputs, byte: 0x01}
    - {id: embed, op: kernel, stream: compute, reads: inputs, writes: out, byte: 0x05, us: 100}
    - {op: synchronize, stream: compute, only: fixed}
    - {id: next-batch, op: host_fill, buffer: inputs, byte: 0x02}
    - {op: synchronize}
"""
    # No check reads the kernel's output: the race is the detector's to find.
    got = _run(tmp_path, text.replace("expect: reproduces, min_rate: 0.9", "expect: clean"), 5)
    (finding,) = got["buggy"].finding_summary(1)
    assert (finding["first"]["kind"], finding["second"]["kind"]) == ("kernel:embed",
                                                                     "host_write")
    assert "before the host rewrites the buffer at next-batch" in finding["missing"]
    assert got["fixed"].detected == 0


def test_a_kernel_over_more_than_eight_spans_is_launched_again_in_order(tmp_path):
    fills = "".join(f"    - {{op: host_fill, buffer: b{i}, byte: 0}}\n" for i in range(10))
    names = ", ".join(f"b{i}" for i in range(10))
    checks = "".join(f"    - {{op: check, buffer: b{i}, byte: 0x33}}\n" for i in range(10))
    text = HEAD.replace("reproduces, min_rate: 0.9", "clean") + fills + (
        f"    - {{id: wide, op: kernel, stream: compute, writes: [{names}], byte: 0x33}}\n"
        "    - {op: synchronize}\n") + checks
    got = _run(tmp_path, text, 2)
    assert got["buggy"].manifested == 0 and got["buggy"].trials == 2


@pytest.mark.parametrize("step, says", [
    ("    - {op: kernel, stream: compute, reads: nowhere}\n",
     "steps[1].reads: unknown lease or buffer 'nowhere'; leases and buffers defined so far: a"),
    ("    - {op: kernel, stream: compute, writes: a}\n",
     "steps[1].writes: a kernel writes its byte, or the first byte it read: give byte, or "
     "reads"),
    ("    - {op: kernel, stream: compute, reads: a, byte: 3}\n",
     "steps[1].byte: a kernel writes its byte over what it writes: give writes too, or no "
     "byte"),
    ("    - {op: kernel, stream: compute}\n",
     "steps[1]: a kernel step reads or writes something: give reads, writes or both"),
    ("    - {op: kernel, stream: compute, reads: a, us: .inf}\n",
     "steps[1].us: a kernel runs for a while and ends; one that never ends is a `delay` step "
     "with `us: .inf`"),
    ("    - {op: host_fill, buffer: a, byte: 1}\n    - {op: kernel, stream: compute, reads: a}\n",
     "steps[2].reads: 'a' names a lease and a pinned buffer both; rename one"),
], ids=["unknown", "writes-nothing-known", "byte-without-writes", "nothing", "never-ends",
        "ambiguous"])
def test_the_loader_refuses_a_kernel_it_cannot_run_saying_what_to_write(tmp_path, step, says):
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + "    - {id: a, op: materialize, pages: 1}\n" + step)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert says in str(caught.value)


def test_minimize_keeps_what_a_kernel_reads_and_drops_a_kernel_whose_memory_went():
    steps = [{"id": "a", "op": "materialize", "pages": 1},
             {"op": "host_fill", "buffer": "pin", "byte": 1},
             {"id": "k", "op": "kernel", "stream": "compute", "reads": ["a", "pin"]},
             {"op": "release", "lease": "a"},
             {"id": "late", "op": "kernel", "stream": "compute", "reads": "a"}]
    kept = _closure(steps, ["buggy"])
    assert [s.get("id", s["op"]) for s in kept] == ["a", "host_fill", "k", "release"]
    assert [s.get("id", s["op"]) for s in _closure(steps[1:], ["buggy"])] == ["host_fill"]


def test_a_kernel_without_a_byte_writes_what_it_read_so_a_stale_input_is_a_stale_result(
        tmp_path):
    """The shape of pytorch/pytorch#191746: inputs filled on one stream, a kernel on another
    reads them before the fill lands and computes from what was there."""
    text = HEAD + """\
    - {id: x, op: materialize, pages: 1}
    - {op: host_fill, buffer: expected, byte: 0x11}
    - {id: randn, op: kernel, stream: compute, writes: x, byte: 0x11, us: 300}
    - {op: record_event, event: inputs, stream: compute, only: fixed}
    - {op: wait_event, event: inputs, stream: offload, only: fixed}
    - {id: out, op: materialize, pages: 1}
    - {id: matmul, op: kernel, stream: offload, reads: x, writes: out}
    - {op: synchronize}
    - {op: check, lease: out, equals: expected}
"""
    got = _run(tmp_path, text)
    assert (got["buggy"].manifested, got["buggy"].detected) == (20, 20)
    assert (got["fixed"].manifested, got["fixed"].detected) == (0, 0)
    detail = got["buggy"].first_manifested.detail
    assert "check: lease out: page 0: 1024/1024 bytes differ" in detail
    assert "what the page held before this trial: nothing wrote it yet" in detail


def test_a_kernel_on_a_reused_page_waits_for_its_release_fence_as_pool_ops_do(tmp_path):
    """The page an offload copy still reads is released and leased again; a kernel writes the
    new lease at once. The pool's release fence orders it (no race); without the fence it
    races the copy, the bug kvcore's release_fence defect stands for."""
    text = HEAD.replace("""    buggy: {expect: reproduces, min_rate: 0.9}
    fixed: {expect: clean}""", """    buggy: {defects: {release_fence: false}, expect: clean}
    fixed: {expect: clean}""") + """\
    - {id: old, op: materialize, pages: 1}
    - {op: delay, stream: offload, us: 200}
    - {id: store, op: copy_to_host, src: old, dst: stored, stream: offload}
    - {op: release, lease: old}
    - {id: new, op: materialize, pages: 1}
    - {id: prefill, op: kernel, stream: compute, writes: new, byte: 0x44}
    - {op: synchronize}
"""
    got = _run(tmp_path, text, 3)
    assert got["fixed"].detected == 0
    (finding,) = got["buggy"].finding_summary(1)
    assert (finding["first"]["step"], finding["second"]["step"]) == ("store", "prefill")
    assert finding["reused"]


def test_a_kept_trace_of_a_kernel_named_by_its_step_id_checks_again(tmp_path):
    """A kernel's op-log kind is ``kernel:`` and its step's id, hyphens and all: the trace a
    corrupt trial keeps loads, and `gpurace check` finds its race again."""
    text = FORWARD_OFFLOAD.replace("id: forward,", "id: forward-pass,")
    path = tmp_path / "kernels.yaml"
    path.write_text(text)
    Runner(RunOptions(backend="sim", trials=1, out_dir=tmp_path / "out", variants=("buggy",),
                      record=True)).run([load_scenario(path)])
    (trace,) = (tmp_path / "out").glob("run-*/*-buggy-t0/trace.jsonl")
    loaded = load_trace(trace)
    assert any(r["kind"] == "kernel:forward-pass" for r in loaded.ops)
    (finding,) = check_trace(loaded.records).findings
    assert finding.first.kind == "kernel:forward-pass"


def parts(writes: str, reads: str) -> str:
    """Two kernels on unordered streams, the first writing ``writes``, the second reading
    ``reads`` (parts of lease kv or buffer staging)."""
    return HEAD.replace("expect: reproduces, min_rate: 0.9", "expect: clean") + f"""\
    - {{id: kv, op: materialize, pages: 2}}
    - {{op: host_fill, buffer: inputs, byte: 1}}
    - {{op: host_fill, buffer: out, byte: 0}}
    - {{op: host_fill, buffer: staging, byte: 0, pages: 2}}
    - {{id: forward, op: kernel, stream: compute, reads: inputs, writes: {writes}, byte: 0x33,
       us: 100}}
    - {{id: offload, op: kernel, stream: offload, reads: {reads}, writes: out, us: 5}}
    - {{op: synchronize}}
"""


@pytest.mark.parametrize("writes, reads, races", [
    ("{lease: kv, page: 1}", "{lease: kv, page: 0}", False),
    ("{lease: kv, page: 1}", "{lease: kv, page: [0, 1]}", True),
    ("{buffer: staging, offset: 0, length: 64}", "{buffer: staging, offset: 64, length: 64}",
     False),
    ("{buffer: staging, offset: 0, length: 64}", "{buffer: staging, offset: 32, length: 64}",
     True),
    ("{lease: kv, offset: 1000, length: 100}", "{lease: kv, page: 1}", True),  # crosses into 1
    ("{lease: kv, offset: 0, length: 100}", "{lease: kv, page: 1}", False),
])
def test_a_kernel_touches_only_the_parts_it_names(tmp_path, writes, reads, races):
    """Pages of a lease or a byte range (of a lease's pages one after another, or of a pinned
    buffer): two kernels on unordered streams race only where their parts overlap."""
    got = _run(tmp_path, parts(writes, reads), 3)
    findings = got["buggy"].finding_summary(1)
    assert bool(findings) == races, findings
    if races:
        (finding,) = findings
        assert (finding["first"]["step"], finding["second"]["step"]) == ("forward", "offload")
        if "staging" in writes:  # the bytes the two parts share, and no more
            assert (finding["second"]["bytes"][0] - finding["first"]["bytes"][0],
                    finding["first"]["access"]) == (32, "write")


def test_a_kernel_writes_its_byte_over_only_the_pages_it_names(tmp_path):
    text = HEAD.replace("expect: reproduces, min_rate: 0.9", "expect: clean") + """\
    - {id: kv, op: materialize, pages: 3}
    - {op: zero_pages, lease: kv, stream: compute}
    - {op: kernel, stream: compute, writes: [{lease: kv, page: [0, 2]}], byte: 0x33}
    - {op: host_fill, buffer: expected, byte: 0, pages: 3}
    - {op: host_fill, buffer: expected, byte: 0x33, page: [0, 2]}
    - {op: synchronize}
    - {op: check, lease: kv, equals: expected}
"""
    got = _run(tmp_path, text, 2)
    assert got["buggy"].manifested == got["fixed"].manifested == 0


@pytest.mark.parametrize("part, says", [
    ("{lease: kv, page: 2}", "page 2 is outside lease 'kv', which has 2 pages of"),
    ("{lease: kv, offset: 0, length: 5000}", "bytes up to 5000 is outside lease 'kv'"),
    ("{lease: kv, buffer: b}", "a part names one lease or one pinned buffer"),
    ("{lease: kv, page: 0, offset: 0, length: 1}", "some pages (`page:` a number or a list) or"),
    ("{lease: kv, offset: 3}", "some pages (`page:` a number or a list) or a byte range"),
    ("{lease: kv, pages: 1}", "unknown key"),
    ("{buffer: b, page: 3}", "buffer 'b' has 1 page, but a kernel touches page 3 of it"),
])
def test_the_loader_checks_a_kernels_parts(tmp_path, part, says):
    text = HEAD + f"""\
    - {{id: kv, op: materialize, pages: 2}}
    - {{op: host_fill, buffer: b, byte: 1}}
    - {{id: k, op: kernel, stream: compute, reads: [{part}], writes: b}}
"""
    path = tmp_path / "parts.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=re.escape(says)):
        load_scenario(path)
