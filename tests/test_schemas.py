"""The JSON Schemas of harness/schemas: valid draft 2020-12, the same as the code builds them, and
true to the documents gpurace really writes (runs, incidents, op traces, list, check and explore
on the simulated device, the shipped ticket and scenario files), while known-bad documents are
refused."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from harness import schemas
from harness.lang import vocabulary as V
from harness.cli import main
from harness.tools import schemas as build

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
TICKET = SCENARIOS / "tickets" / "ninfer-210.jsonl"


def validator(name: str) -> Any:
    return jsonschema.Draft202012Validator(schemas.load(name))


def assert_valid(name: str, document: Any, where: str = "") -> None:
    errors = sorted(validator(name).iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, f"{where or name}: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors[:5])


def refused(name: str, document: Any) -> bool:
    return not validator(name).is_valid(document)


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout


def jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            yield f"{path}:{number}", json.loads(line)


# ---- the schemas themselves ---------------------------------------------------------------------

def test_every_schema_is_valid_draft_2020_12() -> None:
    assert schemas.names() == sorted(build.BUILDERS) == [
        "check", "explore", "list", "report", "run", "scenario", "ticket-record",
        "trace-record"]
    for name in schemas.names():
        schema = schemas.load(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["title"] and schema["description"]


def test_the_committed_files_are_what_the_code_builds() -> None:
    """The files are made from the vocabulary, the limits and the producers' enums: a new op,
    key, bound or outcome that is not in them fails here (remake them with
    `python -m harness.tools.schemas`)."""
    for name, schema in build.schemas().items():
        assert schemas.text(name) == build.text(schema), (
            f"harness/schemas/{name}.schema.json is out of date: run "
            "`python -m harness.tools.schemas`")


def test_load_says_which_schemas_there_are() -> None:
    with pytest.raises(KeyError, match="no schema 'nope'; gpurace has check, explore"):
        schemas.load("nope")


def test_the_step_schema_is_the_vocabulary() -> None:
    """Every op of harness.lang.vocabulary, each with exactly its keys: a step with the required
    keys validates; without one, or with a key the op does not take, it is refused."""
    defs = schemas.load("scenario")["$defs"]
    assert defs["step"]["properties"]["op"]["enum"] == list(V.OPS)
    samples = {"count": 1, "index": 0, "pages": [0, 1], "byte": 0xAB, "duration": 5.0,
               "bool": True}
    for op, spec in V.OPS.items():
        step_schema = defs[f"step-{op}"]
        assert set(step_schema["properties"]) == {*V.STEP_KEYS, *spec.keys}
        step: dict[str, Any] = {"op": op, "id": "s1"}
        for key in spec.required():
            step[key] = samples.get(spec.keys[key].holds, "x")
        for keys, _ in spec.one_of:
            step[keys[0]] = samples.get(spec.keys[keys[0]].holds, "x")
        doc = _scenario([step])
        assert_valid("scenario", doc, op)
        assert refused("scenario", _scenario([{**step, "colour": "red"}]))
        for key in spec.required():
            assert refused("scenario", _scenario([{k: v for k, v in step.items() if k != key}]))
        if spec.id_defines:
            assert refused("scenario", _scenario([{k: v for k, v in step.items() if k != "id"}]))


def test_a_kernels_parts_validate_as_the_loader_reads_them() -> None:
    """A kernel's memory: names, and parts of a lease or buffer (pages, a byte range); a part
    names one of them, and nothing the loader would not read."""
    def kernel(reads: Any) -> dict[str, Any]:
        return _scenario([{"id": "k", "op": "kernel", "stream": "compute", "reads": reads}])

    assert_valid("scenario", kernel(["kv", {"lease": "kv", "page": [0, 1]},
                                     {"buffer": "b", "offset": 0, "length": 64}]))
    assert_valid("scenario", kernel({"lease": "kv", "page": 1}))
    for bad in ({"lease": "kv", "buffer": "b"}, {"page": 1}, {"lease": "kv", "pages": 1},
                {"buffer": "b", "offset": 0, "length": 0}):
        assert refused("scenario", kernel([bad])), bad


def _scenario(steps: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "gpurace/v1", "kind": "Scenario",
            "metadata": {"name": "t", "description": "a test"},
            "spec": {"pool": {"pages": 2}, "variants": {"buggy": {"expect": "reproduces"},
                                                        "fixed": {}},
                     "steps": steps, **spec}}


# ---- real documents ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict, Path]]:
    """Runs on the simulated device, every trial's trace kept: races that pass and incidents
    (release-fence, cross-stream-race), skipped variants (a shard with none of their trials),
    a sweep, crashes in a workload (catalog-reactivation's buggy variant), a race that hid (a
    failure) and a hang."""
    out = tmp_path_factory.mktemp("schema-runs")
    hang = out / "hang.yaml"
    hang.write_text("apiVersion: gpurace/v1\nkind: Scenario\nmetadata: {name: hang}\nspec:\n"
                    "  pool: {pages: 1}\n  timeout: 0.5\n  variants: {stuck: {expect: hang}}\n"
                    "  steps:\n    - {id: stuck, op: delay, stream: compute, us: .inf}\n"
                    "    - {op: synchronize}\n")
    found = []
    for args in (["release-fence", "cross-stream-race", "--trials", "3", "--record"],
                 ["cross-stream-race", "--trials", "1", "--shard", "3/3"],
                 ["release-fence", "--sweep", "--variant", "buggy", "--trials", "2"],
                 ["catalog-reactivation", "--dangerous", "--variant", "buggy", "--trials", "2",
                  "--record"],
                 ["cross-stream-race", "--dangerous", "--variant", "buggy", "--no-amplify",
                  "--no-detect", "--trials", "2"],
                 [str(hang), "--trials", "1"]):
        code, stdout = cli("run", *args, "--backend", "sim", "--format", "json",
                           "--out", str(out))
        assert code in (0, 1, 77), stdout
        doc = json.loads(stdout)
        found.append((doc, Path(doc["folder"])))
    return found


def test_run_documents(runs: list[tuple[dict, Path]]) -> None:
    statuses, outcomes = set(), set()
    for doc, folder in runs:
        on_disk = json.loads((folder / "run.json").read_text())
        assert on_disk == doc
        assert_valid("run", on_disk, str(folder / "run.json"))
        statuses |= {r["status"] for r in doc["results"]}
        outcomes |= {o for r in doc["results"] for o, n in r["outcomes"].items() if n}
    assert statuses == {"pass", "skip", "fail"}
    assert outcomes == {"clean", "corruption", "crash", "hang"}
    assert any(r["sweep"] for doc, _ in runs for r in doc["results"])


def test_incident_reports(runs: list[tuple[dict, Path]]) -> None:
    reports = [Path(p) / "report.json" for doc, _ in runs for r in doc["results"]
               for p in r["reports"]]
    assert len(reports) >= 4
    seen = set()
    for path in reports:
        report = json.loads(path.read_text())
        assert_valid("report", report, str(path))
        seen.add(report["outcome"])
    assert {"corruption", "crash", "hang"} <= seen


def test_every_line_of_every_recorded_op_trace(runs: list[tuple[dict, Path]]) -> None:
    traces = sorted(p for _, folder in runs for p in folder.rglob("*.jsonl"))
    assert len(traces) >= 10
    kinds = set()
    for trace in traces:
        records = list(jsonl(trace))
        assert records[0][1]["type"] == "header"
        for where, record in records:
            assert_valid("trace-record", record, where)
            kinds.add(record["type"])
    assert {"header", "buffer", "stream", "op"} <= kinds


def test_every_line_of_the_shipped_ticket() -> None:
    lines = list(jsonl(TICKET))
    assert len(lines) > 100
    for where, record in lines:
        assert_valid("ticket-record", record, where)


def test_list_check_and_explore_json(runs: list[tuple[dict, Path]]) -> None:
    code, stdout = cli("list", "--format", "json")
    assert code == 0
    listed = json.loads(stdout)
    assert_valid("list", listed)
    assert {d["kind"] for d in listed["documents"]} == {"scenario", "suite"}

    incidents = [Path(p) for doc, _ in runs for r in doc["results"] for p in r["reports"]]
    code, stdout = cli("check", str(incidents[0]), "--format", "json")
    assert code == 1
    checked = json.loads(stdout)
    assert_valid("check", checked)
    assert checked["findings"]
    clean = next(p for _, folder in runs for p in sorted(folder.rglob("trial-*.jsonl"))
                 if "fixed" in p.parent.name)
    code, stdout = cli("check", str(clean), "--format", "json")
    assert code == 0
    assert_valid("check", json.loads(stdout))

    code, stdout = cli("explore", "release-fence", "--bound", "1", "--format", "json")
    assert code == 0
    explored = json.loads(stdout)
    assert_valid("explore", explored)
    assert any(r["failing"] for r in explored["results"])


def test_every_shipped_scenario_and_suite_file() -> None:
    files = sorted(SCENARIOS.rglob("*.yaml"))
    assert len(files) >= 17
    kinds = set()
    for path in files:
        document = yaml.safe_load(path.read_text())
        assert_valid("scenario", document, str(path))
        kinds.add(document["kind"])
    assert kinds == {"Scenario", "Suite"}


def test_a_step_that_never_ends_and_a_ticket_workload() -> None:
    hang = yaml.safe_load("""
        apiVersion: gpurace/v1
        kind: Scenario
        metadata: {name: hang}
        spec:
          pool: {pages: 1}
          variants: {stuck: {expect: hang}}
          steps:
            - {id: stuck, op: delay, stream: compute, us: .inf}
            - {op: synchronize}
    """)
    assert_valid("scenario", hang)
    hang["spec"]["steps"][0]["us"] = 2e7  # finite and past DELAY_MAX_US
    assert refused("scenario", hang)
    ticket = yaml.safe_load("""
        apiVersion: gpurace/v1
        kind: Scenario
        metadata: {name: replay}
        spec:
          pool: {pages: 256}
          variants: {buggy: {defects: {publish_on_legacy_stream: true}, expect: reproduces}}
          amplify: {delay_us: 1000, stream: legacy, before: activate}
          workload: {kind: ticket, path: tickets/ninfer-210.jsonl}
    """)
    assert_valid("scenario", ticket)
    without_path = copy.deepcopy(ticket)
    del without_path["spec"]["workload"]["path"]
    assert refused("scenario", without_path)  # a ticket workload names its ticket
    assert refused("scenario", _changed(ticket, ("spec", "workload", "kind"), "conversation"))
    bad = copy.deepcopy(ticket)
    bad["spec"]["amplify"]["before"] = "write-old"  # a workload's phases only
    assert refused("scenario", bad)


# ---- known-bad documents -------------------------------------------------------------------------

def test_bad_run_and_report_documents_are_refused(runs: list[tuple[dict, Path]]) -> None:
    doc = runs[0][0]
    for path, value in ((("schema",), "gpurace.run/2"), (("results", 0, "status"), "maybe"),
                        (("results", 0, "outcomes", "flaky"), 1), (("exit_code",), 2),
                        (("results", 0, "wall_s"), -1.0), (("seed",), "0"),
                        (("results", 0, "digest"), "abc")):
        assert refused("run", _changed(doc, path, value)), path
    assert refused("run", {k: v for k, v in doc.items() if k != "results"})
    report = json.loads((Path(doc["results"][0]["reports"][0]) / "report.json").read_text())
    for path, value in ((("outcome",), "exploded"), (("trial", "index"), -1),
                        (("variant", "defects", "no_such_defect"), True),
                        (("last_ops", 0, "seq"), 0), (("extra",), 1)):
        assert refused("report", _changed(report, path, value)), path
    assert refused("report", {k: v for k, v in report.items() if k != "trial"})


def test_bad_trace_and_ticket_records_are_refused() -> None:
    op = {"type": "op", "seq": 3, "stream": "host", "kind": "host_write",
          "writes": [[7, 0, 64]], "detail": {"site": "x.py:1"}}
    assert_valid("trace-record", op)
    for path, value in ((("kind",), "teleport"), (("seq",), 0), (("writes", 0), [7, 0]),
                        (("writes", 0, 1), -4), (("colour",), "red"),
                        (("kind",), "alloc")):  # an alloc names its range and owner
        assert refused("trace-record", _changed(op, path, value)), path
    assert_valid("trace-record", {**op, "stream": "compute", "kind": "kernel:read_table"})
    assert refused("trace-record", {**op, "stream": "compute", "kind": "host_write"})
    assert refused("trace-record", {"type": "stream", "name": "host", "blocking": False,
                                    "legacy": False})
    assert refused("trace-record", {"type": "header", "schema": "gpurace.trace/2"})
    assert refused("trace-record", {"type": "footer"})
    assert_valid("trace-record", {"type": "times", "ops": [[3, 10, 20], [4, 15, 15]]})
    assert refused("trace-record", {"type": "times", "ops": [[3, 10]]})
    assert refused("trace-record", {"type": "times", "ops": [[3, -1, 20]]})
    header, request = (record for _, record in list(jsonl(TICKET))[:2])
    for record, path, value in ((header, ("kv", "dtype"), "i4"), (header, ("lanes",), 0),
                                (header, ("name",), "Ninfer"), (request, ("prompt_tokens",), -1),
                                (request, ("turn",), 0), (request, ("priority",), 1)):
        assert refused("ticket-record", _changed(record, path, value)), path
    assert refused("ticket-record", {k: v for k, v in request.items() if k != "lane"})


def test_bad_scenarios_are_refused() -> None:
    good = _scenario([{"id": "p", "op": "materialize", "pages": 1},
                      {"op": "check", "lease": "p", "byte": 0}])
    assert_valid("scenario", good)
    bad_steps = [
        {"op": "teleport"},
        {"op": "check", "lease": "p", "buffer": "b", "byte": 0},      # two things to read
        {"op": "check", "lease": "p"},                               # nothing to compare with
        {"op": "host_fill", "buffer": "b", "byte": 256},
        {"op": "host_fill", "buffer": "b", "byte": 1, "page": 0, "offset": 0},
        {"op": "release", "lease": "p", "only": "buggy", "unless": "fixed"},
        {"op": "release", "lease": "Not A Name"},
        {"op": "materialize", "pages": 0, "id": "q"},
    ]
    for step in bad_steps:
        assert refused("scenario", _scenario([good["spec"]["steps"][0], step])), step
    for path, value in ((("apiVersion",), "gpurace/v2"), (("kind",), "Scenery"),
                        (("spec", "variants", "Buggy"), {}), (("spec", "trials"), 0),
                        (("spec", "pool", "planes"), [{"dtype": "i4", "leading": 1,
                                                       "heads": 1}]),
                        (("spec", "pool", "planes"), [{"dtype": "i8", "leading": 1,
                                                       "heads": 1, "align": 96}]),
                        (("spec", "streams"), {"a": "legacy-ish"}), (("spec", "timeout"), 0),
                        (("spec", "workload"), {"kind": "conversation"}),
                        (("metadata", "dangerous"), "yes"), (("extra",), 1)):
        assert refused("scenario", _changed(good, path, value)), path
    suite = {"apiVersion": "gpurace/v1", "kind": "Suite", "metadata": {"name": "s"},
             "spec": {"scenarios": ["a.yaml"]}}
    assert_valid("scenario", suite)
    assert refused("scenario", _changed(suite, ("spec", "scenarios"), []))
    assert refused("scenario", _changed(suite, ("spec", "steps"), []))


def test_bad_list_check_and_explore_documents_are_refused() -> None:
    listed = {"schema": "gpurace.list/1", "broken": [], "documents": [
        {"name": "s", "kind": "suite", "path": "s.yaml", "description": "",
         "scenarios": ["a.yaml"]}]}
    assert_valid("list", listed)
    assert refused("list", {k: v for k, v in listed.items() if k != "schema"})
    assert refused("list", listed["documents"])  # the old bare list
    assert refused("list", _changed(listed, ("documents", 0, "kind"), "scenario"))
    checked = {"schema": "gpurace.check/1", "trace": "t.jsonl", "scenario": None,
               "variant": None, "findings": []}
    assert_valid("check", checked)
    assert refused("check", _changed(checked, ("schema",), "gpurace.check/2"))
    assert refused("check", {k: v for k, v in checked.items() if k != "schema"})
    explored = {"schema": "gpurace.explore/1", "met": True, "results": [
        {"scenario": "s", "variant": "v", "strategy": "pct", "ops": 3, "decisions": 2,
         "tried": 4,
         "stop": "budget", "stop_reason": "the run budget was spent",
         "failing": [{"token": "s1-2.3~1.0", "outcome": "crash", "detail": ""}]}]}
    assert_valid("explore", explored)
    for path, value in ((("results", 0, "failing", 0, "token"), "2.3"),
                        (("results", 0, "failing", 0, "outcome"), "clean"),
                        (("results", 0, "strategy"), "bfs")):
        assert refused("explore", _changed(explored, path, value)), path


def _changed(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A deep copy of ``document`` with the value at ``path`` set to ``value``."""
    changed = copy.deepcopy(document)
    at = changed
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return changed
