"""A device index (a block table): a page list copied into a lease, which kernels follow where
they run, so a table rewritten early sends them to another batch's blocks (#30)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import ScenarioError
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.scenario import load_scenario

HEAD = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: block-table, description: the next batch's block table copied over this one's}
spec:
  pool: {pages: 8, page_tokens: 64, planes: [{dtype: i8, leading: 8, heads: 2, align: 256}]}
  streams: {compute: non-blocking, copy: non-blocking}
  trials: 20
  variants:
    buggy: {expect: reproduces, min_rate: 0.9}
    fixed: {expect: clean}
  amplify: {delay_us: 1000, stream: compute, before: attend-a}
  steps:
    - {id: batch-a, op: materialize, pages: 2}
    - {id: batch-b, op: materialize, pages: 2}
    - {id: table, op: materialize, pages: 1}
    - {op: host_fill, buffer: a-tokens, byte: 0xAA, pages: 2}
    - {op: host_fill, buffer: b-tokens, byte: 0xBB, pages: 2}
    - {op: copy_from_host, src: a-tokens, dst: batch-a, stream: compute}
    - {op: copy_from_host, src: b-tokens, dst: batch-b, stream: compute}
    - {op: page_list, buffer: a-list, lease: batch-a}
    - {op: page_list, buffer: b-list, lease: batch-b}
    - {id: table-a, op: copy_from_host, src: a-list, dst: table, stream: compute}
"""

STALE = HEAD + """\
    - {id: attend-a, op: attention, page_list: table, byte: 0xAA, stream: compute, assert: false}
    - {id: table-b, op: copy_from_host, src: b-list, dst: table, stream: copy, only: buggy}
    - {id: table-b, op: copy_from_host, src: b-list, dst: table, stream: compute, only: fixed}
    - {op: synchronize}
"""


def _run(tmp_path: Path, text: str, *, amplify: bool = True) -> dict[str, object]:
    path = tmp_path / "table.yaml"
    path.write_text(text)
    result = Runner(RunOptions(backend="sim", trials=20, out_dir=tmp_path / "out",
                               amplify=amplify)).run([load_scenario(path)])
    return {r.variant: r for r in result.results}


def test_a_block_table_rewritten_before_its_kernel_ran_sends_it_to_the_next_batch(tmp_path):
    got = _run(tmp_path, STALE)
    buggy, fixed = got["buggy"], got["fixed"]
    assert buggy.manifested == buggy.trials == 20
    assert fixed.manifested == 0 and fixed.detected == 0
    assert buggy.first_manifested is not None
    # It read batch B's blocks: 2 pages of bytes that are not 0xAA.
    assert "attention through page list table read" in buggy.first_manifested.detail
    assert "another owner's data" in buggy.first_manifested.detail
    (finding,) = buggy.finding_summary(1)
    assert (finding["first"]["step"], finding["second"]["step"]) == ("attend-a", "table-b")
    assert "lease table" in finding["missing"]


def test_the_race_on_the_table_is_found_without_amplification(tmp_path):
    got = _run(tmp_path, STALE, amplify=False)
    assert got["buggy"].detected == 20 and got["buggy"].manifested == 0
    assert got["fixed"].detected == 0


def test_gather_through_a_device_index_moves_the_pages_it_names(tmp_path):
    """The pages batch A's table names, copied into a pinned buffer, amplified or not: A's
    bytes (a table that named other pages would bring theirs)."""
    text = HEAD.replace("before: attend-a", "before: gathered") + """\
    - {id: gathered, op: gather, page_list: table, to: packed, stream: compute}
    - {op: synchronize}
    - {op: check, buffer: packed, equals: a-tokens}
"""
    for amplify in (True, False):
        got = _run(tmp_path, text, amplify=amplify)
        for variant in ("buggy", "fixed"):
            assert got[variant].manifested == 0 and got[variant].detected == 0
    b_text = text.replace("equals: a-tokens", "equals: b-tokens")
    assert _run(tmp_path, b_text)["fixed"].manifested == 20  # the check does read them


@pytest.mark.parametrize("steps, says", [
    ("    - {op: attention, page_list: batch-b, byte: 0xBB, stream: compute}\n",
     "spec.steps[10].page_list: lease 'batch-b' holds no page list in variant buggy when this "
     "attention runs: "
     "copy one into it first (copy_from_host of a buffer a page_list step wrote)"),
    ("    - {op: copy_from_host, src: b-tokens, dst: table, stream: compute}\n"
     "    - {op: attention, page_list: table, byte: 0xBB, stream: compute}\n",
     "spec.steps[11].page_list: lease 'table' holds no page list in variant buggy when this "
     "attention runs"),
], ids=["never-copied", "overwritten-by-data"])
def test_a_lease_without_a_page_list_is_refused_where_a_kernel_follows_it(tmp_path, steps,
                                                                         says):
    path = tmp_path / "table.yaml"
    path.write_text(HEAD + steps)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert says in str(caught.value), str(caught.value)
