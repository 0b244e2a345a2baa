"""The fix a finding gives is the one engines make, and the loader's hints point at the step that
says it (#30): each text pinned on the smallest program or scenario that needs it.

The race detector's texts are checked on capture event sequences (a watched program's words),
the loader's on scenario files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import ScenarioError
from harness.lang.scenario import load_scenario
from harness.lang.targets import SCENARIO_ROOT
from test_capture import BASE, S1, S2, _alloc, _findings, _op, _streams

S3 = 0x33
LEGACY = 0  # the legacy default stream's id in capture events


def test_a_copy_on_the_legacy_stream_read_by_a_non_blocking_one_is_moved_to_the_reader():
    """#210's shape: the fix engines made is the copy on the consumer's stream, not an event."""
    events = _streams() + [_alloc(BASE, 4096, "table"),
                           _op(LEGACY, "copy_htod", 20, w=[("d", BASE, 4096)]),
                           _op(S2, "kernel:index_select", 21, r=[("d", BASE, 4096)])]
    (f,) = _findings(events)
    assert "; issue the copy at prog.py:20 on s2, the stream that reads what it wrote, " \
        "instead of the legacy default stream (or record an event on the legacy default stream " \
        "after prog.py:20 and make s2 wait on it before prog.py:21) (s2 is a non-blocking " \
        "stream: it and the legacy stream do not wait for each other)" in f["missing"], \
        f["missing"]


def test_a_kernel_on_the_legacy_stream_keeps_the_event_fix():
    events = _streams() + [_alloc(BASE, 4096, "table"),
                           _op(LEGACY, "kernel:fill_", 20, w=[("d", BASE, 4096)]),
                           _op(S2, "kernel:sum", 21, r=[("d", BASE, 4096)])]
    (f,) = _findings(events)
    assert "issue the copy" not in f["missing"]
    assert "record an event on the legacy default stream after prog.py:20 and make s2 wait " \
        "on it before prog.py:21" in f["missing"]


def test_a_wait_made_on_the_wrong_stream_is_said_so():
    """The gradient written on s1, the wait for it made by s3, the reduce run on s2."""
    events = _streams() + [
        ["stream", S3, {"blocking": False, "legacy": False, "name": "s3"}],
        _alloc(BASE, 4096, "grad"), ["event", 7, {"site": "prog.py:4", "name": "done"}],
        _op(S1, "kernel:mm", 30, w=[("d", BASE, 4096)]),
        ["record", 7, S1, "prog.py:31"], ["wait", 7, S3, "prog.py:32"],
        _op(S2, "kernel:reduce_scatter", 33, r=[("d", BASE, 4096)])]
    (f,) = _findings(events)
    assert f["missing"].endswith(
        ": s3 waited on event done at prog.py:32, which covers prog.py:30, but prog.py:33 runs "
        "on s2, which did not wait: make s2 wait on done before prog.py:33 (or issue "
        "prog.py:33 on s3)"), f["missing"]


def test_a_wait_on_an_event_never_recorded_covers_nothing_and_is_said_so():
    events = _streams() + [_alloc(BASE, 4096, "kv"),
                           ["event", 7, {"site": "prog.py:4", "name": "ready"}],
                           _op(S1, "kernel:fill_", 10, w=[("d", BASE, 4096)]),
                           ["wait", 7, S2, "prog.py:13"],
                           _op(S2, "kernel:sum", 14, r=[("d", BASE, 4096)])]
    (f,) = _findings(events)
    assert f["missing"].endswith(
        ": the wait at prog.py:13 was on event ready, which had no record yet (an event never "
        "recorded counts as complete), so it covered nothing: record event ready on s1 after "
        "prog.py:10, before the wait"), f["missing"]


# --- the loader's hints ------------------------------------------------------------------

BASE_SCENARIO = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: hint, description: a hint}
spec:
  pool: {pages: 4, page_tokens: 64, planes: [{dtype: i8, leading: 8, heads: 2, align: 256}]}
  streams: {STREAMS}
  trials: 2
  variants: {buggy: {expect: clean}}
  steps:
    - {id: a, op: materialize, pages: 1}
    - {op: host_alloc, buffer: pin}
"""


def _refused(tmp_path: Path, step: str, streams: str = "side: non-blocking") -> str:
    path = tmp_path / "hint.yaml"
    path.write_text(BASE_SCENARIO.replace("STREAMS", streams) + step)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    return str(caught.value)


@pytest.mark.parametrize("step, says", [
    ("    - {op: record_stream, lease: a, stream: side}\n",
     "steps[2].op: record_stream is the caching allocator's: add `allocator: caching` to "
     "spec.pool (the default pool, `fenced`, waits at release for every stream that used a "
     "page, and its pages belong to no stream)"),
    ("    - {id: b, op: materialize, pages: 1, stream: side}\n",
     "steps[2].stream: a lease's stream is the caching allocator's: add `allocator: caching`"),
    ("    - {op: copy_page, src: a, dst: pin, stream: side}\n",
     "steps[2].dst: 'pin' is a buffer, not a lease: copy_page copies between leases; "
     "copy_to_host copies a lease's pages into a pinned buffer"),
    ("    - {op: copy_from_host, src: a, dst: a, stream: side}\n",
     "steps[2].src: 'a' is a lease, not a buffer: copy_from_host copies a pinned buffer into a "
     "lease; copy_page copies a lease's pages to another lease"),
    ("    - {op: record_event, event: ev, stream: side}\n"
     "    - {op: release, lease: a, after: ev}\n",
     "steps[3].after: release takes no after: release fences its pages itself (kvcore's "
     "release fence: the next owner's work waits for the streams still using them); a pinned "
     "buffer handed out again only once events complete is host_free's `after:`"),
    ("    - {op: record_event, event: ev, stream: null}\n",
     "steps[2].stream: YAML reads this as nothing (null), not a name; CUDA's null stream, the "
     "legacy default stream, is a stream of kind legacy: declare one under spec.streams"),
], ids=["record_stream", "materialize-stream", "copy_page-into-pinned", "copy_from_host-from-lease",
        "release-after", "stream-null"])
def test_the_loader_points_at_the_step_that_says_it(tmp_path, step, says):
    assert says in _refused(tmp_path, step)


def test_stream_null_names_the_legacy_stream_where_there_is_one(tmp_path):
    said = _refused(tmp_path, "    - {op: record_event, event: ev, stream: ~}\n",
                    streams="side: non-blocking, host: legacy")
    assert "CUDA's null stream, the legacy default stream, is 'host' here (to name a stream " \
        "'null', quote it)" in said


def test_a_stream_declared_as_yamls_null_is_refused_and_a_quoted_one_is_a_name(tmp_path):
    said = _refused(tmp_path, "", streams="side: non-blocking, null: legacy")
    assert "spec.streams.null: YAML reads null as nothing (null), not a name: quote it " \
        "('null') to name a stream so" in said
    path = tmp_path / "quoted.yaml"
    path.write_text(BASE_SCENARIO.replace("STREAMS", "side: non-blocking, 'null': legacy")
                    + "    - {op: record_event, event: ev, stream: 'null'}\n")
    assert [s.name for s in load_scenario(path).streams] == ["side", "null"]


def test_a_copy_on_the_legacy_stream_reading_a_non_blocking_ones_write_moves_to_the_writer():
    """pytorch-2702's and MIOpen #3299's shape: the legacy stream's copy reads what a
    non-blocking stream's kernel wrote; the fix made was the copy on that stream."""
    events = _streams() + [_alloc(BASE, 4096, "tensor"),
                           _op(S1, "kernel:mm", 40, w=[("d", BASE, 4096)]),
                           _op(LEGACY, "copy_dtoh", 41, r=[("d", BASE, 4096)])]
    (f,) = _findings(events)
    assert "; issue the copy at prog.py:41 on s1, the stream that wrote what it reads, instead " \
        "of the legacy default stream (or record an event on s1 after prog.py:40 and make " \
        "the legacy default stream wait on it before prog.py:41)" in f["missing"], f["missing"]


def _reused_block(source: str | None) -> list[list]:
    """A block allocated on s1, read on s2, freed, and handed to s1's next allocation: the
    caching allocator's reuse race, as PyTorch's source (with the allocation's stream) or
    CuPy's says it."""
    def alloc(n: int, name: str) -> list:
        event = _alloc(BASE, n, name)
        event[4] |= {"stream": S1} | ({"source": source} if source else {})
        return event
    return _streams() + [
        alloc(4096, "x"),
        _op(S1, "kernel:fill_", 10, w=[("d", BASE, 4096)]),
        ["event", 1, {}], ["record", 1, S1, "prog.py:11"], ["wait", 1, S2, "prog.py:11"],
        _op(S2, "kernel:sum", 12, r=[("d", BASE, 4096)]),
        ["free", "d", BASE, {"site": "prog.py:13"}],
        alloc(2048, "y"),
        _op(S1, "kernel:fill_", 15, w=[("d", BASE, 2048)])]


def test_a_torch_block_reused_under_a_side_streams_read_gets_record_stream():
    """PyTorch's caching allocator knows the stream a tensor was allocated on and what
    record_stream named: the fix is record_stream (torchrec #4231's)."""
    (f,) = _findings(_reused_block("torch"))
    assert "the caching allocator handed tensor x float32[1024] made at prog.py:3 out on s1 " \
        "and gave its bytes to s1's next allocation at once: record it on s2 (record_stream) " \
        "before its release at prog.py:13" in f["missing"], f["missing"]


def test_a_cupy_block_reused_under_a_side_streams_read_gets_an_event():
    """CuPy's pool has no record_stream: the fix stays an event and a wait."""
    (f,) = _findings(_reused_block("cupy"))
    assert "record_stream" not in f["missing"]
    assert "record an event on s2 after prog.py:12 and make s1 wait on it before prog.py:15 " \
        "reuses the bytes" in f["missing"], f["missing"]


def test_a_caching_pools_lease_read_by_another_stream_gets_record_stream(tmp_path):
    """The scenario's caching pool says it as PyTorch's does, and the scenario with the
    record_stream step is clean."""
    zoo = SCENARIO_ROOT / "zoo" / "torchrec_4231.yaml"
    got = {}
    for variant in ("buggy", "fixed"):
        result = CliRunner().invoke(main, ["run", str(zoo), "--backend", "sim", "--variant",
                                           variant, "--trials", "2", "--no-amplify",
                                           "--format", "json", "--out", str(tmp_path)])
        (got[variant],) = json.loads(result.stdout)["results"]
    (f,) = got["buggy"]["findings"]
    assert "the caching allocator handed lease activation out on main and gave its bytes to " \
        "main's next allocation at once: record it on d2h (record_stream) before its release " \
        "at step resize-0" in f["missing"], f["missing"]
    assert "or allocate it on d2h instead" in f["missing"]  # Megatron-LM #6187's fix
    assert got["fixed"]["detected"] == 0 and got["fixed"]["findings"] == []
