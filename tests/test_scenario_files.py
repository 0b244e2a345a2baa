"""Scenario and suite files: the repository's files load with the values they state, and every
kind of mistake is reported at its exact file:line:col and document path."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvcore
from harness.errors import ScenarioError
from harness.lang.model import Amplify, Location, Scenario, Suite, Workload
from harness.lang.scenario import load_document, load_scenario, load_suite
from harness.lang.vocabulary import OPS, REFERENCES, holds

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"

# A valid scenario; the cases below each break one line of it. Line numbers, for reference:
#  6 pool, 7 trials, 8 timeout, 10 buggy, 11 fixed, 12 amplify, 14-18 the five steps.
BASE = """\
apiVersion: gpurace/v1
kind: Scenario
metadata:
  name: demo
spec:
  pool: {pages: 2}
  trials: 10
  timeout: 5
  variants:
    buggy: {defects: {release_fence: false}, expect: reproduces, min_rate: 0.5}
    fixed: {expect: clean}
  amplify: {delay_us: 100, stream: transfer, before: write-old}
  steps:
    - {id: old-page, op: materialize, pages: 1}
    - {op: host_fill, buffer: old, byte: 0xAB}
    - {id: write-old, op: copy_from_host, src: old, dst: old-page, stream: transfer}
    - {op: synchronize}
    - {id: verify, op: check, lease: old-page, equals: old}
"""

SYNC = "    - {op: synchronize}"  # line 17, the step most cases replace


def edited(old: str, new: str) -> str:
    """BASE with its one occurrence of ``old`` replaced by ``new``."""
    assert BASE.count(old) == 1, f"{old!r} must occur once in BASE"
    return BASE.replace(old, new)


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path: Path, load=load_scenario) -> str:
    with pytest.raises(ScenarioError) as err:
        load(path)
    return str(err.value)


# --------------------------------------------------------------------------------------------
# The repository's files


def test_every_repository_scenario_loads() -> None:
    files = sorted(SCENARIOS.glob("*.yaml"))
    assert len(files) >= 3
    for file in files:
        scenario = load_scenario(file)
        assert isinstance(scenario, Scenario)
        assert scenario.path == file


def test_cross_stream_race_values() -> None:
    s = load_scenario(SCENARIOS / "cross_stream_race.yaml")
    assert s.name == "cross-stream-race"
    assert s.dangerous is True
    assert s.tags == ("seed", "release", "ninfer-210")
    assert (s.trials, s.timeout_s) == (200, 10.0)
    assert s.pool.pages == 2 and s.pool.planes[0].dtype == "i8"
    assert len(s.steps) == 9
    assert s.workload is None
    assert s.amplify == Amplify(delay_us=1000.0, stream="transfer", before="write-old",
                                sweep=(0.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0))
    buggy = s.variant("buggy")
    assert buggy.defects == kvcore.Defects(release_fence=False)
    assert (buggy.expect, buggy.min_rate) == ("reproduces", 0.9)
    assert s.variant("fixed").defects == kvcore.Defects()
    assert s.variant("fixed").expect == "clean"


def test_cross_stream_race_steps() -> None:
    s = load_scenario(SCENARIOS / "cross_stream_race.yaml")
    fill = s.steps[1]
    assert (fill.op, fill.args, fill.id, fill.index) == ("host_fill",
                                                         {"buffer": "old", "byte": 0xAB}, None, 1)
    write_old = s.steps[2]
    assert write_old.args == {"src": "old", "dst": "old-page", "stream": "transfer"}
    assert s.steps[6].args["stream"] == "compute"
    assert s.steps[7].args == {}
    assert s.steps[8].label == "verify" and s.steps[7].label == "7:synchronize"
    assert write_old.where == Location(str(SCENARIOS / "cross_stream_race.yaml"), 22, 7,
                                       "spec.steps[2]")


def test_release_fence_values() -> None:
    s = load_scenario(SCENARIOS / "release_fence.yaml")
    assert s.name == "release-fence" and s.dangerous is False
    assert len(s.steps) == 12
    assert s.steps[4].args == {"src": "old-page", "dst": "readback", "stream": "transfer"}
    assert s.steps[10].args == {"buffer": "readback", "equals": "old"}
    assert s.amplify is not None and s.amplify.before == "read-old"


def test_catalog_reactivation_values() -> None:
    s = load_scenario(SCENARIOS / "catalog_reactivation.yaml")
    assert s.workload == Workload(kind="conversation", requests=100, initial_pages=4,
                                  pages_per_turn=1, churn_pages=2)
    assert s.steps == ()
    assert (s.pool.pages, s.pool.table_rows, s.pool.max_pages_per_row) == (256, 4, 128)
    assert s.variant("buggy").defects == kvcore.Defects(publish_on_legacy_stream=True)
    assert s.amplify is not None
    assert (s.amplify.stream, s.amplify.before) == ("legacy", "activate")
    assert (s.trials, s.timeout_s) == (20, 30.0)


def test_smoke_suite_loads() -> None:
    suite = load_suite(SCENARIOS / "suites" / "smoke.yaml")
    assert suite.name == "smoke"
    # It says what it holds: one scenario, not "the safe scenarios".
    assert suite.description.startswith("a safe scenario") and len(suite.scenarios) == 1
    assert suite.scenarios == ((SCENARIOS / "release_fence.yaml").resolve(),)
    assert load_scenario(suite.scenarios[0]).name == "release-fence"


def test_load_document_dispatches_on_kind() -> None:
    assert isinstance(load_document(SCENARIOS / "suites" / "smoke.yaml"), Suite)
    assert isinstance(load_document(str(SCENARIOS / "release_fence.yaml")), Scenario)


def test_base_and_defaults(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, BASE))
    assert s.description == "" and s.dangerous is False and s.tags == ()
    assert (s.pool.page_tokens, s.pool.table_rows, s.pool.max_pages_per_row) == (64, 4, 0)
    assert s.variant("fixed").min_rate == 0.0
    minimal = edited("  trials: 10\n  timeout: 5\n", "")
    s = load_scenario(write(tmp_path, minimal, "minimal.yaml"))
    assert (s.trials, s.timeout_s) == (100, 10.0)


def test_every_step_key_has_a_meaning() -> None:
    kinds = {"stream", "count", "index", "pages", "byte", "duration", "micros", "bool",
             "new-buffer",
             "alloc-buffer", "new-event", "mutex", "page-list", *REFERENCES}
    for op, spec in OPS.items():
        assert spec.doc
        for key in spec.keys:
            assert holds(op, key) in kinds, (op, key)


def test_all_step_ops_accepted(tmp_path: Path) -> None:
    steps = """\
    - {op: catalog, id: conv}
    - {op: retain, catalog: conv, lease: old-page}
    - {op: bind, catalog: conv}
    - {op: publish, catalog: conv, stream: legacy}
    - {op: activate, catalog: conv, stream: compute}
    - {op: read_table, catalog: conv, stream: compute, assert: false}
    - {op: kv_write, catalog: conv, byte: 7, stream: compute}
    - {op: attention, catalog: conv, byte: 7, stream: compute, assert: false}
    - {op: host_fill, buffer: small, byte: 7}
    - {op: read_pinned, buffer: small, byte: 7, stream: compute}
    - {id: forward, op: kernel, stream: compute, reads: [old-page, small], writes: small,
       byte: 7, us: 5}
    - {op: page_list, buffer: blocks, lease: old-page}
    - {op: attention, page_list: blocks, byte: 7, stream: compute}
    - {op: gather, page_list: blocks, to: gathered, stream: compute}
    - {op: scatter, page_list: blocks, from: gathered, stream: compute}
    - {op: record_event, event: done, stream: transfer}
    - {op: wait_event, event: done, stream: compute}
    - {op: delay, us: 2.5, stream: transfer_stream}
    - {op: copy_page, src: old-page, dst: old-page, stream: compute}
    - {op: zero_pages, lease: old-page, stream: compute}
    - {op: copy_to_host, src: old-page, dst: back, stream: compute}
    - {op: synchronize, stream: legacy_stream}
    - {op: check, buffer: back, byte: 0}
    - {op: host_fill, buffer: old, byte: 1, pages: 1}
    - {op: host_alloc, buffer: staging, pages: 2}
    - {op: host_fill, buffer: staging, byte: 3, page: [0, 1]}
    - {op: event_query, event: done, poll: true}
    - {op: host_free, buffer: staging, after: done}
    - {op: synchronize, event: done}
    - {id: spare, op: materialize, pages: 1, stream: transfer}
    - {op: record_stream, lease: spare, stream: compute}
    - {op: release, lease: spare}
    - {id: other, op: catalog}
    - {op: release_catalog, catalog: other}
    - {op: lock, mutex: pool-lock, thread: t1}
    - {op: unlock, mutex: pool-lock, thread: t1}
    - {id: decode, op: graph_capture, stream: compute}
    - {op: copy_page, src: old-page, dst: old-page, stream: compute}
    - {op: graph_end, graph: decode}
    - {op: graph_replay, graph: decode, stream: transfer}"""
    s = load_scenario(write(tmp_path, edited(SYNC, steps).replace(
        "pool: {pages: 2}", "pool: {pages: 2, allocator: caching}")))
    assert {step.op for step in s.steps} == set(OPS)
    by_op = {step.op: step for step in s.steps}  # the last step of each op
    # kvcore's stream names are aliases of a scenario's default streams.
    assert by_op["delay"].args == {"us": 2.5, "stream": "transfer"}
    assert by_op["record_event"].args == {"event": "done", "stream": "transfer"}
    assert by_op["synchronize"].args == {"event": "done"}
    assert by_op["read_table"].args == {"catalog": "conv", "stream": "compute", "assert": False}
    assert by_op["host_fill"].args == {"buffer": "staging", "byte": 3, "page": (0, 1)}
    assert by_op["host_free"].args == {"buffer": "staging", "after": "done"}
    assert by_op["catalog"].id == "other" and by_op["catalog"].args == {}
    assert by_op["release_catalog"].args == {"catalog": "other"}
    assert by_op["lock"].args == {"mutex": "pool-lock"} and by_op["lock"].thread == "t1"
    assert by_op["release"].thread is None
    assert by_op["materialize"].args == {"pages": 1, "stream": "transfer"}
    assert by_op["record_stream"].args == {"lease": "spare", "stream": "compute"}


# --------------------------------------------------------------------------------------------
# Mistakes in a scenario: (what to replace in BASE, with what, the error after "file:")

CASES = {
    "wrong-api-version": (
        "apiVersion: gpurace/v1", "apiVersion: gpurace/v2",
        "1:13: apiVersion: unsupported apiVersion 'gpurace/v2'; use gpurace/v1"),
    "missing-api-version": (
        "apiVersion: gpurace/v1\n", "",
        "1:1: (document): missing the required key 'apiVersion'; the file starts with "
        "apiVersion: gpurace/v1 and kind: Scenario or Suite"),
    "unknown-kind": (
        "kind: Scenario", "kind: Scenaro",
        "2:7: kind: unknown kind 'Scenaro' (did you mean 'Scenario'?); use one of "
        "Scenario, Suite"),
    "unknown-top-level-key": (
        "spec:\n", "extra: 1\nspec:\n",
        "5:1: extra: unknown key 'extra'; allowed keys: apiVersion, kind, metadata, spec"),
    "unknown-spec-key": (
        "  trials: 10", "  trails: 10",
        "7:3: spec.trails: unknown key 'trails' (did you mean 'trials'?); allowed keys: pool, "
        "streams, trials, timeout, variants, amplify, steps, workload"),
    "unknown-step-key": (
        SYNC, "    - {op: synchronize, steam: compute}",
        "17:25: spec.steps[3].steam: unknown key 'steam' for op synchronize (did you mean "
        "'stream'?); allowed keys: id, op, only, unless, thread, stream, event"),
    "missing-metadata-name": (
        "  name: demo", "  description: no name",
        "4:3: metadata: metadata is missing the required key 'name'; add it"),
    "bad-metadata-name": (
        "  name: demo", "  name: Demo Race",
        "4:9: metadata.name: invalid name 'Demo Race': use lower-case letters, digits, '-' "
        "and '_', starting with a letter or digit"),
    "name-resolves-to-bool": (
        "  name: demo", "  name: on",
        "4:9: metadata.name: expected a string, got the boolean true (quote it, 'on', if you "
        "mean the text)"),
    "missing-pool-pages": (
        "pool: {pages: 2}", "pool: {page_tokens: 64}",
        "6:9: spec.pool: the pool is missing the required key 'pages'; add it"),
    "pages-string": (
        "pool: {pages: 2}", "pool: {pages: two}",
        "6:17: spec.pool.pages: expected a positive integer, got the string 'two'"),
    "pages-float": (
        "pool: {pages: 2}", "pool: {pages: 2.0}",
        "6:17: spec.pool.pages: expected a positive integer, got 2.0"),
    "trials-bool": (
        "trials: 10", "trials: true",
        "7:11: spec.trials: expected a positive integer, got the boolean true"),
    "timeout-negative": (
        "timeout: 5", "timeout: -1",
        "8:12: spec.timeout: expected a positive number of seconds, got -1"),
    "unknown-dtype": (
        "pool: {pages: 2}", "pool: {pages: 2, planes: [{dtype: f64, leading: 8, heads: 2}]}",
        "6:37: spec.pool.planes[0].dtype: unknown dtype 'f64' (did you mean 'f16'?); use one "
        "of i8, fp8, f16, bf16, f32"),
    "align-not-power-of-two": (
        "pool: {pages: 2}",
        "pool: {pages: 2, planes: [{dtype: i8, leading: 8, heads: 2, align: 100}]}",
        "6:70: spec.pool.planes[0].align: align must be a power of two (64, 128, 256...), "
        "not 100"),
    "unknown-defect": (
        "release_fence: false", "release_fences: false",
        "10:23: spec.variants.buggy.defects.release_fences: unknown key 'release_fences' "
        "(did you mean 'release_fence'?); allowed keys: release_fence, "
        "publish_on_legacy_stream, table_shadow_wait"),
    "defect-not-bool": (
        "release_fence: false", "release_fence: 0",
        "10:38: spec.variants.buggy.defects.release_fence: expected true or false, got 0"),
    "unknown-expectation": (
        "expect: reproduces", "expect: reproduce",
        "10:54: spec.variants.buggy.expect: unknown expectation 'reproduce' (did you mean "
        "'reproduces'?); use one of clean, reproduces, hang"),
    "min-rate-above-one": (
        "min_rate: 0.5", "min_rate: 1.5",
        "10:76: spec.variants.buggy.min_rate: expected a number from 0 to 1, got 1.5"),
    "bad-variant-name": (
        "    fixed: {expect: clean}", "    Fixed: {expect: clean}",
        "11:5: spec.variants.Fixed: invalid name 'Fixed': use lower-case letters, digits, "
        "'-' and '_', starting with a letter or digit"),
    "delay-us-bool": (
        "delay_us: 100", "delay_us: true",
        "12:23: spec.amplify.delay_us: expected a non-negative number of microseconds, got "
        "the boolean true"),
    "amplify-before-no-step": (
        "before: write-old", "before: write-od",
        "12:54: spec.amplify.before: no step has id 'write-od' (did you mean 'write-old'?); "
        "step ids: old-page, write-old, verify"),
    "amplify-unknown-stream": (
        "stream: transfer, before", "stream: gpu, before",
        "12:36: spec.amplify.stream: unknown stream 'gpu'; use compute, transfer, legacy (or "
        "kvcore's names for them, stream, transfer_stream and legacy_stream), or declare the "
        "scenario's own streams under spec.streams"),
    "both-steps-and-workload": (
        "  steps:\n", "  workload: {kind: conversation}\n  steps:\n",
        "14:3: spec.steps: a scenario has either steps or a workload, not both; remove one"),
    "unknown-op": (
        SYNC, "    - {op: synchronise}",
        "17:12: spec.steps[3].op: unknown op 'synchronise' (did you mean 'synchronize'?); use "
        "one of materialize, record_stream, release, host_fill, host_alloc, host_free, "
        "copy_from_host, copy_to_host, copy_page, zero_pages, catalog, retain, bind, publish, "
        "activate, "
        "release_catalog, read_table, page_list, kv_write, attention, gather, scatter, "
        "kernel, read_pinned, record_event, wait_event, event_query, synchronize, delay, "
        "graph_capture, graph_end, graph_replay, lock, unlock, check"),
    "step-without-op": (
        SYNC, "    - {stream: compute}",
        "17:7: spec.steps[3]: a step needs an op; use one of materialize, record_stream, "
        "release, host_fill, host_alloc, host_free, copy_from_host, copy_to_host, copy_page, "
        "zero_pages, catalog, "
        "retain, bind, publish, activate, release_catalog, read_table, page_list, kv_write, "
        "attention, gather, scatter, kernel, read_pinned, record_event, wait_event, "
        "event_query, synchronize, delay, graph_capture, graph_end, graph_replay, lock, unlock, "
        "check"),
    "step-not-a-mapping": (
        SYNC, "    - synchronize",
        "17:7: spec.steps[3]: expected a step (a mapping with an op), got the string "
        "'synchronize'"),
    "unknown-stream": (
        SYNC, "    - {op: synchronize, stream: transfr}",
        "17:33: spec.steps[3].stream: unknown stream 'transfr' (did you mean 'transfer'?); "
        "use compute, transfer, legacy (or kvcore's names for them, stream, transfer_stream and "
        "legacy_stream), or declare the scenario's own streams under spec.streams"),
    "missing-step-key": (
        SYNC, "    - {op: copy_page, src: old-page, dst: old-page}",
        "17:7: spec.steps[3]: a copy_page step is missing the required key 'stream'; add it"),
    "undefined-lease": (
        SYNC, "    - {op: release, lease: new-page}",
        "17:28: spec.steps[3].lease: unknown lease 'new-page' (did you mean 'old-page'?); "
        "leases defined so far: old-page"),
    "lease-defined-later": (
        SYNC, "    - {op: zero_pages, lease: new-page, stream: compute}\n"
              "    - {id: new-page, op: materialize, pages: 1}",
        "17:31: spec.steps[3].lease: unknown lease 'new-page': steps[4] defines it, after this "
        "step; move that step before this one"),
    "buffer-never-filled": (
        "src: old, dst: old-page", "src: new, dst: old-page",
        "16:48: spec.steps[2].src: unknown buffer 'new'; buffers defined so far: old"),
    "undefined-catalog": (
        SYNC, "    - {op: retain, catalog: conv, lease: old-page}",
        "17:29: spec.steps[3].catalog: unknown catalog 'conv'; none is defined before this "
        "step (a catalog step with an id defines one)"),
    "materialize-without-id": (
        SYNC, "    - {op: materialize, pages: 1}",
        "17:7: spec.steps[3]: a materialize step needs an id: it names the lease later steps "
        "refer to"),
    "duplicate-step-id": (
        SYNC, "    - {id: verify, op: synchronize}",
        "18:12: spec.steps[4].id: duplicate step id 'verify': steps[3] ({file}:17:7) has it "
        "too; rename one"),
    "duplicate-mapping-key": (
        "  timeout: 5", "  timeout: 5\n  timeout: 6",
        "9:3: spec.timeout: duplicate key 'timeout' (first at line 8, column 3); keep one"),
    "duplicate-key-in-flow-mapping": (
        SYNC, "    - {op: synchronize, op: delay}",
        "17:25: spec.steps[3].op: duplicate key 'op' (first at line 17, column 8); keep one"),
    "wait-event-never-recorded": (
        SYNC, "    - {op: wait_event, event: done, stream: compute}",
        "17:31: spec.steps[3].event: unknown event 'done'; none is recorded before this step "
        "(a record_event step records one)"),
    "wait-event-recorded-later": (
        SYNC, "    - {op: wait_event, event: done, stream: compute}\n"
              "    - {op: record_event, event: done, stream: transfer}",
        "17:31: spec.steps[3].event: unknown event 'done': steps[4] defines it, after this "
        "step; move that step before this one"),
    "byte-too-big": (
        "byte: 0xAB", "byte: 300",
        "15:42: spec.steps[1].byte: expected an integer from 0 to 255, got 300"),
    "delay-zero": (
        SYNC, "    - {op: delay, us: 0, stream: compute}",
        "17:23: spec.steps[3].us: expected a positive number of microseconds (or .inf), got 0"),
    "check-equals-and-byte": (
        "lease: old-page, equals: old}", "lease: old-page, equals: old, byte: 1}",
        "18:7: spec.steps[4]: a check step needs exactly one of equals (a host buffer) or "
        "byte (0-255), to compare with; it has both"),
    "check-reads-nothing": (
        "lease: old-page, equals: old}", "equals: old}",
        "18:7: spec.steps[4]: a check step needs exactly one of lease (device pages) or buffer "
        "(a host buffer), to read; it has neither"),
    "unknown-tag": (
        "trials: 10", "trials: !seconds 10",
        "7:11: spec.trials: unsupported tag !seconds; remove it"),
}


@pytest.mark.parametrize("old, new, expected", CASES.values(), ids=CASES.keys())
def test_bad_scenario(tmp_path: Path, old: str, new: str, expected: str) -> None:
    path = write(tmp_path, edited(old, new))
    assert error_of(path) == f"{path}:{expected}".replace("{file}", str(path))


def test_neither_steps_nor_workload(tmp_path: Path) -> None:
    path = write(tmp_path, BASE[:BASE.index("  amplify:")])
    assert error_of(path) == (f"{path}:6:3: spec: a scenario needs steps (a list of steps) or "
                              "a workload; add one")


def test_workload_amplify_before_unknown_phase(tmp_path: Path) -> None:
    # A pool the workload fits (4 initial pages, then one a request; kvcore refuses more).
    text = BASE[:BASE.index("  amplify:")].replace("{pages: 2}", "{pages: 8}") + (
        "  amplify: {delay_us: 10, stream: legacy, before: decod}\n"
        "  workload: {kind: conversation, requests: 3}\n")
    path = write(tmp_path, text)
    assert error_of(path) == (f"{path}:12:51: spec.amplify.before: unknown workload phase "
                              "'decod' (did you mean 'decode'?); use one of churn, prefill, "
                              "activate, decode")


def test_workload_defaults_and_kind(tmp_path: Path) -> None:
    head = BASE[:BASE.index("  amplify:")].replace("{pages: 2}", "{pages: 8}")
    s = load_scenario(write(tmp_path, head + "  workload: {kind: conversation, requests: 3}\n"))
    assert s.workload == Workload(requests=3) and s.steps == () and s.amplify is None
    path = write(tmp_path, head + "  workload: {kind: chat}\n", "chat.yaml")
    assert error_of(path) == (f"{path}:12:20: spec.workload.kind: unknown workload kind "
                              "'chat'; use one of conversation, ticket")


# --------------------------------------------------------------------------------------------
# Files that are not YAML, or not there


def test_yaml_unclosed_bracket(tmp_path: Path) -> None:
    path = write(tmp_path, edited("equals: old}", "equals: old"))
    assert error_of(path) == (f"{path}:19:1: (yaml): expected ',' or '}}', but got "
                              "'<stream end>' (while parsing a flow mapping at line 18, "
                              "column 7)")


def test_yaml_tab_indentation(tmp_path: Path) -> None:
    path = write(tmp_path, edited("  name: demo", "\tname: demo"))
    assert error_of(path) == (f"{path}:4:1: (yaml): found character '\\t' that cannot start "
                              "any token; indent with spaces, not tabs")


def test_yaml_bad_indentation(tmp_path: Path) -> None:
    path = write(tmp_path, edited("  trials: 10", "    trials: 10"))
    assert error_of(path) == (f"{path}:7:5: (yaml): expected <block end>, but found "
                              "'<block mapping start>' (while parsing a block mapping at "
                              "line 6, column 3); check this line's indentation")


def test_yaml_two_documents(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + "---\n" + BASE)
    assert error_of(path) == (f"{path}:19:1: (yaml): expected a single document in the "
                              "stream, but found another document")


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n", "---\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    assert error_of(path) == (f"{path}:1:1: (document): the file is empty; start it with "
                              "apiVersion: gpurace/v1, kind, metadata and spec")


def test_document_not_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "- apiVersion: gpurace/v1\n")
    assert error_of(path) == (f"{path}:1:1: (document): expected a mapping with keys "
                              "apiVersion, kind, metadata, spec, got a list")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.where == Location(str(path), 1, 1, "(file)")
    assert str(err.value) == (f"{path}:1:1: (file): cannot read the file (No such file or "
                              "directory); check the path and its permissions")


def test_suite_given_to_load_scenario(tmp_path: Path) -> None:
    path = SCENARIOS / "suites" / "smoke.yaml"
    assert error_of(path) == (f"{path}:3:7: kind: this is a Suite file, but a Scenario was "
                              "expected; pass a Scenario file here")


def test_error_location_fields(tmp_path: Path) -> None:
    path = write(tmp_path, edited("byte: 0xAB", "byte: 300"))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.where == Location(str(path), 15, 42, "spec.steps[1].byte")
    assert err.value.exit_code == 2


# --------------------------------------------------------------------------------------------
# Suites

SUITE = """\
apiVersion: gpurace/v1
kind: Suite
metadata: {name: mine, description: two of them}
spec:
  scenarios:
    - ../scenario.yaml
    - MISSING
"""


def test_suite_resolves_relative_to_its_folder(tmp_path: Path) -> None:
    write(tmp_path, BASE)
    write(tmp_path, BASE.replace("name: demo", "name: other"), "other.yaml")
    (tmp_path / "suites").mkdir()
    path = write(tmp_path / "suites", SUITE.replace("MISSING", "../other.yaml"), "mine.yaml")
    suite = load_suite(path)
    assert suite == Suite(name="mine", path=path, description="two of them",
                          scenarios=(tmp_path / "scenario.yaml", tmp_path / "other.yaml"))
    assert load_document(path) == suite


def test_suite_naming_a_missing_file(tmp_path: Path) -> None:
    write(tmp_path, BASE)
    (tmp_path / "suites").mkdir()
    path = write(tmp_path / "suites", SUITE.replace("MISSING", "gone.yaml"), "mine.yaml")
    assert error_of(path, load_suite) == (
        f"{path}:7:7: spec.scenarios[1]: no scenario file at {tmp_path / 'suites/gone.yaml'} "
        f"(paths are relative to the suite's folder, {tmp_path / 'suites'})")


def test_suite_with_scenario_keys(tmp_path: Path) -> None:
    path = write(tmp_path, SUITE.replace("two of them", "x, dangerous: true"))
    assert error_of(path, load_suite) == (
        f"{path}:3:40: metadata.dangerous: unknown key 'dangerous'; allowed keys: name, "
        "description")


def test_suite_with_no_scenarios(tmp_path: Path) -> None:
    path = write(tmp_path, SUITE[:SUITE.index("    -")].replace("scenarios:", "scenarios: []"))
    assert error_of(path, load_suite) == (
        f"{path}:5:14: spec.scenarios: expected a non-empty list of scenario file paths, got "
        "an empty list")


def test_ticket_workload_resolves_its_path(tmp_path: Path) -> None:
    ticket = tmp_path / "t.jsonl"
    # A ticket the replay can run: the loader reads it now (an empty one is refused).
    ticket.write_text((SCENARIOS / "tickets" / "ninfer-210.jsonl").read_text())
    text = ("apiVersion: gpurace/v1\nkind: Scenario\nmetadata: {name: t}\n"
            "spec:\n  pool: {pages: 2}\n  variants: {fixed: {}}\n"
            "  workload: {kind: ticket, path: t.jsonl}\n")
    path = write(tmp_path, text)
    scenario = load_scenario(path)
    assert scenario.workload is not None and scenario.workload.ticket == ticket
    missing = write(tmp_path, text.replace("t.jsonl", "nope.jsonl"))
    assert "no ticket file at" in error_of(missing)
    needs = write(tmp_path, text.replace(", path: t.jsonl", ""))
    assert "a ticket workload needs `path:`" in error_of(needs)
