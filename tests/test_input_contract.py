"""The input contract (issue #11, part A): whatever comes in from a file is refused as one line,
``file:line:col: field: what is wrong, the limit, what to do`` (exit 2), within a second; never
a traceback, an internal error (exit 3), or unbounded time or memory.

tests/corpus/ holds one small file per failure a hostile-input run found; each is loaded here
(and given to the matching command), with the place and the words its refusal must have. The
``ok-`` files are inputs that failed before and now run.
"""

from __future__ import annotations

import ast
import json
import os
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import limits
from harness.cli import main
from harness.races.detector import check_trace
from harness.races.findings import Owners as _Owners
from harness.errors import HarnessError, ScenarioError, TraceError
from harness.run.executor import TrialExecutor
from harness.inputs import Unreadable, echo, read_input
from harness.lang.scenario import load_document, load_scenario
from harness.traces.optrace import is_op_trace, load_trace
from harness.traces.ticket import load_ticket
from harness.lang.yamlnodes import open_yaml

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus"

# file -> (line:col: field, a phrase of the message). Line and column point at what to fix.
REFUSED: dict[str, tuple[str, str]] = {
    # 1. Nesting deeper than Python's recursion limit: refused at the node, while composing.
    "yaml/deep-nesting.yaml": ("2:67: a[0][0][0][0][0][0][0][0][0][0…[0][0][0][0][0][0][0][0][0]"
                               "[0][0][0][0][0][0][0][0][0][0][0]",
                               "nested deeper than 64 mappings and lists"),
    "yaml/alias-bomb.yaml": ("6:11: e[1]", "more than 30,000 values in the document (an alias "
                                          "counts as a copy of what it names)"),
    # 2. Integers past Python's 4,300 digits: the scalar is refused before it is read.
    "yaml/huge-integer.yaml": ("7:11: spec.trials", "a value of 5,000 characters; a value has "
                                                    "at most 1024"),
    "ticket/huge-integer.jsonl": ("2:27: (record)", "a number of more than 4,300 digits"),
    "trace/huge-integer.jsonl": ("2:23: (record)", "a number of more than 4,300 digits"),
    "ticket/deep-nesting.jsonl": ("2:65: (record)", "nested too deep to read"),
    "trace/deep-nesting.jsonl": ("2:65: (record)", "nested too deep to read"),
    # 3. A timeout the watchdog's wait overflows on.
    "yaml/timeout-overflow.yaml": ("8:12: spec.timeout", "2147484 is more than 86400, the most "
                                                         "seconds a trial may take (a day)"),
    # 4. A name too long for a file name; values quoted in messages are cut.
    "yaml/long-name.yaml": ("4:18: metadata.name", "a name of 300 characters ('"
                            + "n" * limits.ECHO_MAX_CHARS + "…'); a name has at most 64"),
    # 5. What the loader accepted and kvcore refused in the worker (exit 3).
    "yaml/pool-exhausted.yaml": ("10:39: spec.steps[1].pages", "1 more page while 2 of the "
                                                               "pool's 2 are leased"),
    "yaml/pool-exhausted-one-variant.yaml": ("10:39: spec.steps[1].pages", "are leased in "
                                                                           "variant fixed"),
    "yaml/activate-released.yaml": ("14:31: spec.steps[5].catalog", "catalog 'c' retains lease "
                                                                    "'a', released at steps[4]"),
    "yaml/activate-unbound.yaml": ("10:31: spec.steps[1].catalog", "is bound to no table row"),
    "yaml/read-unbound.yaml": ("10:33: spec.steps[1].catalog", "is bound to no table row"),
    "yaml/too-many-binds.yaml": ("12:7: spec.steps[3]", "no table row is left to bind: the "
                                                        "table's 1 row is bound already"),
    "yaml/row-overflow.yaml": ("13:31: spec.steps[4].catalog", "publishes 2 entries of catalog "
                                                               "'c', more than a table row's 1"),
    "yaml/read-overflow.yaml": ("13:33: spec.steps[4].catalog", "reads 2 entries of catalog "
                                                                "'c', more than a table row's 1"),
    "yaml/copy-past-buffer.yaml": ("11:33: spec.steps[2].src", "buffer 'b' has 1 page, but "
                                                               "lease 'a' has 2 pages"),
    "yaml/copy-past-allocation.yaml": ("11:39: spec.steps[2].dst", "buffer 'b' has 1 page, but "
                                                                   "lease 'a' has 2 pages"),
    "yaml/check-past-buffer.yaml": ("11:37: spec.steps[2].equals", "all compared: the step "
                                                                   "would overrun it"),
    "yaml/counting-reads.yaml": ("75:61: spec.steps[66].assert", "more than 64 counting kernels "
                                                                 "(read_table and attention"),
    "yaml/retain-twice.yaml": ("13:39: spec.steps[3].lease", "catalog 'c' retains lease 'a' "
                                                             "already (steps[2]"),
    "yaml/conversation-overflow.yaml": ("8:44: spec.workload.requests", "retains 11 pages by "
                                                                        "its last request"),
    "yaml/world-too-large.yaml": ("6:9: spec.pool", "more than 1,073,741,824 (1 GiB), the most "
                                                    "a scenario's world may allocate"),
    "yaml/priority-huge.yaml": ("8:47: spec.streams.s.priority", "expected an integer from "
                                                                 "-1000 to 1000"),
    "ticket/pool-overflow.jsonl": ("3:89: prompt_tokens", "5 in all, more than the pool's 4 "
                                                          "(pool_pages)"),
    "ticket/empty-first-turn.jsonl": ("2:89: prompt_tokens", "a conversation's first request "
                                                             "holds no token"),
    "ticket/page-tokens-million.jsonl": ("1:75: page_tokens", "1000000 (a number) is more than "
                                                              "65536, the most tokens of a page"),
    "ticket/lanes-huge.jsonl": ("1:63: lanes", "is more than 1024, the most lanes of a ticket"),
    "ticket/tokens-huge.jsonl": ("2:89: prompt_tokens", "the most tokens of a request"),
    "ticket/world-too-large.jsonl": ("1:97: pool_pages", "more than 1,073,741,824 (1 GiB)"),
    # 6. No upper bounds: sizes, delays, sweeps.
    "yaml/table-rows-huge.yaml": ("6:32: spec.pool.table_rows", "200000000 is more than 4096"),
    "yaml/host-buffer-huge.yaml": ("9:50: spec.steps[0].pages", "the world would take more "
                                                                "than 1,073,741,824 bytes"),
    "yaml/delay-huge.yaml": ("8:23: spec.amplify.delay_us", "1e+300 is more than 10000000, the "
                                                            "most microseconds of a delay"),
    "yaml/sweep-too-long.yaml": ("8:45: spec.amplify.sweep", "100 sweep delays is more than 64"),
    "trace/terabyte-buffer.jsonl": ("2:62: nbytes", "is more than 274877906944, the most bytes "
                                                    "of a buffer (256 GiB)"),
    "trace/delay-huge.jsonl": ("1:105: delay_us", "from 0 to 10,000,000 (10 s), not 1e+300"),
    "trace/delay-infinite.jsonl": ("1:49: delay_us", "not Infinity"),
    "yaml/suite-lists-itself.yaml": ("6:15: spec.scenarios[0]", "suite-lists-itself.yaml is a "
                                                                "suite, and a suite lists "
                                                                "scenario files"),
    "yaml/suite-cycle-a.yaml": ("6:15: spec.scenarios[0]", "suite-cycle-b.yaml is a suite"),
    "yaml/suite-nul-path.yaml": ("6:15: spec.scenarios[0]", "no scenario file at a\\x00b.yaml"),
    # 7. Not UTF-8: the line and column of the first bad byte.
    "yaml/non-utf8.yaml": ("3:9: (yaml)", "not UTF-8 text (byte 0xe9); save the file as UTF-8"),
    "ticket/non-utf8.jsonl": ("2:41: (record)", "not UTF-8 text (byte 0xe9)"),
    "yaml/nul-byte.yaml": ("3:9: (yaml)", "unacceptable character #x0000; remove it"),
    # 8. Plain text: a key with a newline and an escape stays one printable line.
    "yaml/control-characters.yaml": ("4:21: metadata.evil\\nkey\\x1b[31m",
                                     "unknown key 'evil\\nkey\\x1b[31m'"),
}

LOADERS = {"yaml": load_document, "ticket": load_ticket, "trace": load_trace}


def _refusal(name: str) -> tuple[Path, str]:
    path = CORPUS / name
    start = time.perf_counter()
    with pytest.raises(HarnessError) as caught:
        LOADERS[name.split("/")[0]](path)
    assert time.perf_counter() - start < 1.0, f"{name} took more than a second to refuse"
    assert isinstance(caught.value, (ScenarioError, TraceError)), caught.value
    return path, str(caught.value)


def test_the_corpus_is_all_here() -> None:
    files = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*") if p.is_file()}
    assert files == set(REFUSED) | {"yaml/ok-no-churn.yaml", "yaml/ticket-workload-bad-ticket.yaml",
                                    "yaml/suite-cycle-b.yaml", "yaml/ok-odd-page-stride.yaml",
                                    "yaml/ok-check-against-allocation.yaml",
                                    "trace/ok-huge-buffer-race.jsonl",
                                    "trace/header-path-dev-zero.jsonl"}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_corpus_file_is_refused_at_its_place_within_a_second(name: str) -> None:
    path, message = _refusal(name)
    where, phrase = REFUSED[name]
    assert message.startswith(f"{path}:{where}: "), message
    assert phrase in message, message
    assert message.isprintable(), message  # one line: no newline, no escape sequence
    assert ":" in message and "Traceback" not in message


def test_a_scenario_is_refused_at_its_tickets_line() -> None:
    """A ticket workload's ticket is read with the scenario: the replay's refusal comes at
    load, at the scenario's path and the ticket's line, not from a worker."""
    path = CORPUS / "yaml" / "ticket-workload-bad-ticket.yaml"
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(caught.value).startswith(
        f"{path}:8:34: spec.workload.path: the ticket is refused: "
        f"{path.parent}/../ticket/pool-overflow.jsonl:3:89: prompt_tokens: ")


def _command(path: Path) -> list[str]:
    kind = path.parent.name
    if kind == "ticket":
        return ["replay", str(path), "--backend", "sim"]
    if kind == "trace":
        return ["check", str(path)]
    return ["run", str(path), "--backend", "sim", "--trials", "1", "--timeout", "5"]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_corpus_file_exits_2_with_one_line(name: str, tmp_path: Path) -> None:
    path, message = _refusal(name)
    result = CliRunner().invoke(main, [*_command(path), *(
        ["--out", str(tmp_path)] if path.parent.name != "trace" else [])])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:"), result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["ok-no-churn.yaml", "ok-odd-page-stride.yaml",
                                  "ok-check-against-allocation.yaml"])
def test_what_failed_in_the_worker_now_runs(tmp_path: Path, name: str) -> None:
    """churn_pages: 0 loaded, then kvcore's release of no page failed in the worker; an odd
    page size left the last host buffer no room in the pinned arena; a world buffer checked
    against a larger allocated one was refused."""
    path = CORPUS / "yaml" / name
    scenario = load_scenario(path)
    assert TrialExecutor(scenario, scenario.variants[0], "sim").run(0, 1).outcome.value == \
        "clean"
    result = CliRunner().invoke(main, ["run", str(path), "--backend", "sim", "--out",
                                       str(tmp_path)])
    assert result.exit_code == 0, result.output


def test_a_huge_buffer_is_checked_in_ranges_not_bytes() -> None:
    """A 200 GiB buffer of 1-byte pages written whole by two streams: the detector once
    visited every one of its 200 G pages. Its memory of the buffer is one range per extent
    the accesses made, so the race is found from one range."""
    path = CORPUS / "trace" / "ok-huge-buffer-race.jsonl"
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 1 and "1 race" in result.output, result.output
    detector = check_trace(load_trace(path).records)
    [finding] = detector.findings
    assert (finding.first.stream, finding.second.stream) == ("s1", "s2")
    [shadow] = detector._shadows.values()
    assert len(shadow.starts) == 1


def test_owners_of_many_leases_cost_no_more_than_one_each() -> None:
    """20,000 leases materialized and released on one buffer: each alloc and free rescanned
    every owner the buffer ever had (quadratic in a long replay)."""
    owners = _Owners()
    start = time.perf_counter()
    for i in range(20_000):
        owners.alloc(0, i * 64, (i + 1) * 64, f"lease {i}", 2 * i + 1)
    for i in range(0, 20_000, 2):
        owners.free(0, i * 64, (i + 1) * 64, 50_000 + i, "release")
    owners.alloc(0, 0, 64 * 4, "again", 90_000)  # over two freed and two live owners
    assert time.perf_counter() - start < 1.0
    assert owners.at(0, 64 * 3 + 5, 2 * 3 + 1).name == "lease 3"  # type: ignore[union-attr]
    assert owners.at(0, 64 * 3 + 5, 90_001).name == "again"  # type: ignore[union-attr]
    assert owners.at(0, 64 * 8, 40_000).name == "lease 8"  # type: ignore[union-attr]
    assert owners.at(0, 64 * 8, 50_000 + 9) is None  # freed at 50,008
    assert owners.at(0, 64 * 7 + 1, 80_000).name == "lease 7"  # type: ignore[union-attr]


# ---- the one reader ---------------------------------------------------------------------------


def _special_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    with open(big, "wb") as file:  # sparse: no disk is written
        file.truncate(limits.TRACE_MAX_BYTES + 1)
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    return {"a device": (Path("/dev/zero"), "a device, not a file"),
            "a pipe": (fifo, "a pipe, not a file"),
            "a folder": (tmp_path, "a folder, not a file"),
            "a link to a device": (link, "a device, not a file"),
            "too big": (big, "more than"),
            "missing": (tmp_path / "nope", "cannot read the file")}


@pytest.mark.parametrize("loader", [load_scenario, load_ticket, load_trace],
                         ids=["scenario", "ticket", "trace"])
def test_only_regular_files_within_their_limit_are_read(tmp_path: Path, loader: object) -> None:
    done = threading.Event()
    for case, (path, phrase) in _special_files(tmp_path).items():
        start = time.perf_counter()
        with pytest.raises((ScenarioError, TraceError)) as caught:
            loader(path)  # type: ignore[operator]
        assert time.perf_counter() - start < 1.0, case
        assert str(caught.value).startswith(f"{path}:1:1: (file): "), caught.value
        assert phrase in str(caught.value), (case, str(caught.value))
    done.set()


def test_sniffing_a_trace_reads_only_a_regular_files_head(tmp_path: Path) -> None:
    for path, _ in _special_files(tmp_path).values():
        assert is_op_trace(path) is False
    with pytest.raises(Unreadable, match="more than a ticket may have"):
        read_input(CORPUS / "yaml" / "counting-reads.yaml", 100, "a ticket")
    assert len(read_input(CORPUS / "yaml" / "counting-reads.yaml", 100, "x", head=True)) == 100


def test_minimize_follows_a_trace_headers_path_only_to_a_regular_file(tmp_path: Path) -> None:
    """The header said path: /dev/zero, and minimize read it until MemoryError."""
    path = CORPUS / "trace" / "header-path-dev-zero.jsonl"
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["minimize", str(path), "-o", str(tmp_path / "m.yaml")])
    assert time.perf_counter() - start < 2.0
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {path}:1:") and "path: it was recorded from "\
        "/dev/zero, which is not a file here" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_minimize_refuses_a_scenario_that_never_ends(tmp_path: Path) -> None:
    """minimize runs its trials in its own process, with no watchdog: a hang would be for
    ever."""
    scenario = tmp_path / "hang.yaml"
    scenario.write_text("apiVersion: gpurace/v1\nkind: Scenario\nmetadata: {name: hang}\n"
                        "spec:\n  pool: {pages: 2}\n  variants: {buggy: {}}\n  steps:\n"
                        "    - {id: stuck, op: delay, stream: compute, us: .inf}\n"
                        "    - {op: synchronize}\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"type": "header", "schema": "gpurace.trace/1",
                                 "path": str(scenario), "variant": "buggy", "seed": 1}) + "\n")
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["minimize", str(trace), "-o", str(tmp_path / "m.yaml")])
    assert time.perf_counter() - start < 2.0
    assert result.exit_code == 2 and result.output.startswith(
        f"error: {scenario}:8:7: stuck: this step never ends (us: .inf)"), result.output


def test_minimize_says_a_trace_headers_variant_is_not_in_its_scenario(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    header = {"type": "header", "schema": "gpurace.trace/1",
              "path": str(REPO / "scenarios" / "release_fence.yaml"), "variant": "nope",
              "seed": 1}
    trace.write_text(json.dumps(header) + "\n")
    column = json.dumps(header).index('"variant":') + 1
    result = CliRunner().invoke(main, ["minimize", str(trace), "-o", str(tmp_path / "m.yaml")])
    assert result.exit_code == 2 and result.output.startswith(
        f"error: {trace}:1:{column}: variant: "), result.output
    assert "has no variant 'nope' (it has buggy, fixed)" in result.output


def test_minimize_reads_a_report_only_if_it_is_a_file_within_its_limit(tmp_path: Path) -> None:
    """A report.json that is a pipe blocked minimize for ever (a huge one filled memory)."""
    os.mkfifo(tmp_path / "report.json")
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["minimize", str(tmp_path), "-o", str(tmp_path / "m")])
    assert time.perf_counter() - start < 2.0
    assert result.exit_code == 2 and result.output.startswith(
        f"error: {tmp_path / 'report.json'}:1:1: (file): a pipe, not a file"), result.output
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "report.json", "wb") as file:
        file.truncate(limits.REPORT_MAX_BYTES + 1)
    result = CliRunner().invoke(main, ["minimize", str(big), "-o", str(tmp_path / "m")])
    assert result.exit_code == 2 and "is more than a report may have (8 MiB)" in result.output


@pytest.mark.parametrize("damage, field", [
    ({"scenario": {"path": 3}}, "scenario.path"),
    ({"variant": "buggy"}, "variant.defects"),
    ({"trial": {"seed": -1}}, "trial.seed"),
    ({"outcome": "exploded"}, "outcome"),
    ({"outcome": "clean", "findings": [{"buffer": "kv"}]}, "findings[0]"),
])
def test_minimize_says_which_field_of_a_damaged_report_it_cannot_use(
        tmp_path: Path, damage: dict, field: str) -> None:
    scenario = REPO / "scenarios" / "release_fence.yaml"
    report = {"schema": "gpurace.report/1", "scenario": {"path": str(scenario)},
              "variant": {"name": "buggy", "defects": {}}, "trial": {"seed": 1},
              "outcome": "corruption", **damage}
    (tmp_path / "report.json").write_text(json.dumps(report))
    result = CliRunner().invoke(main, ["minimize", str(tmp_path), "-o", str(tmp_path / "m")])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {tmp_path / 'report.json'}: {field}: "), \
        result.output
    assert "Traceback" not in result.output


# ---- boundaries ----------------------------------------------------------------------------


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    return path


def test_nesting_up_to_the_limit_is_read(tmp_path: Path) -> None:
    depth = limits.YAML_MAX_DEPTH
    # The top mapping and depth - 1 lists: the limit exactly.
    open_yaml(_yaml(tmp_path, "a: " + "[" * (depth - 1) + "]" * (depth - 1)))
    with pytest.raises(ScenarioError, match="nested deeper than 64"):
        open_yaml(_yaml(tmp_path, "a: " + "[" * depth + "]" * depth))


def test_values_and_names_up_to_their_limits_are_read(tmp_path: Path) -> None:
    head = "apiVersion: gpurace/v1\nkind: Scenario\nmetadata: {name: %s, description: %s}\n"
    tail = "spec:\n  pool: {pages: 2}\n  variants: {v: {}}\n  steps: [{op: synchronize}]\n"
    name, text = "n" * limits.NAME_MAX_CHARS, "d" * limits.TEXT_MAX_CHARS
    assert load_scenario(_yaml(tmp_path, head % (name, text) + tail)).name == name
    with pytest.raises(ScenarioError, match="a value of 1,025 characters"):
        load_scenario(_yaml(tmp_path, head % (name, text + "d") + tail))
    with pytest.raises(ScenarioError, match="a name of 65 characters"):
        load_scenario(_yaml(tmp_path, head % (name + "n", text) + tail))


def test_timeouts_up_to_a_day(tmp_path: Path) -> None:
    text = ("apiVersion: gpurace/v1\nkind: Scenario\nmetadata: {name: t}\nspec:\n"
            "  pool: {pages: 2}\n  timeout: %s\n  variants: {v: {}}\n"
            "  steps: [{op: synchronize}]\n")
    assert load_scenario(_yaml(tmp_path, text % 86400)).timeout_s == limits.TIMEOUT_MAX_S
    with pytest.raises(ScenarioError, match="86401 is more than 86400"):
        load_scenario(_yaml(tmp_path, text % 86401))


def test_an_error_on_line_100_is_plain_text(tmp_path: Path) -> None:
    """rich turned `:100:` into an emoji; the message itself is plain text (the CLI escapes
    it)."""
    text = ("apiVersion: gpurace/v1\nkind: Scenario\nmetadata: {name: t}\nspec:\n"
            "  pool: {pages: 2}\n  variants: {v: {}}\n  steps:\n"
            + "    - {op: synchronize}\n" * 92 + "    - {op: teleport}\n")
    path = _yaml(tmp_path, text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(caught.value).startswith(f"{path}:100:12: spec.steps[92].op: unknown op "
                                        "'teleport'")


def test_values_quoted_in_messages_are_cut() -> None:
    assert echo("x" * 1000) == "'" + "x" * limits.ECHO_MAX_CHARS + "…'"
    assert echo(10 ** 100).endswith("…") and len(echo(10 ** 100)) == limits.ECHO_MAX_CHARS + 1
    assert echo("a\nb\x1b") == "'a\\nb\\x1b'"


def test_every_limit_has_a_docstring_and_a_line_in_the_readme() -> None:
    """One module holds the limits, each saying what it bounds and why; docs/limits.md lists
    them."""
    tree = ast.parse(Path(limits.__file__).read_text())
    body = tree.body
    names = []
    for i, node in enumerate(body):
        if isinstance(node, ast.Assign) and node.targets[0].id.isupper():  # type: ignore
            name = node.targets[0].id  # type: ignore[attr-defined]
            if name in ("KiB", "MiB", "GiB"):
                continue
            names.append(name)
            following = body[i + 1] if i + 1 < len(body) else None
            assert isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant), \
                f"{name} has no docstring"
    section = (REPO / "docs" / "limits.md").read_text()
    missing = [n for n in names if f"`{n}`" not in section]
    assert not missing, f"docs/limits.md lacks {missing}"
