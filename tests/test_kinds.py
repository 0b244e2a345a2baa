"""A file given to the wrong command is named for what it is, with the command that reads it
(#29: a ticket given to `gpurace run` said "(yaml): expected '<document start>', but found
'{'"; a scenario given to `gpurace replay` said "(record): truncated or not JSON")."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.traces.kinds import document_kind

ROOT = Path(__file__).resolve().parent.parent
TICKET = ROOT / "scenarios" / "tickets" / "ninfer-210.jsonl"
SCENARIO = ROOT / "scenarios" / "release_fence.yaml"
SUITE = ROOT / "scenarios" / "suites" / "smoke.yaml"


@pytest.mark.parametrize("command, path, words", [
    (["run"], TICKET, "(file): this is a ticket, not a scenario or suite: replay it with "
                      "`gpurace replay FILE`"),
    (["replay"], SCENARIO, "(file): this is a scenario, not a ticket: run it with `gpurace "
                           "run FILE`"),
    (["check"], SUITE, "(file): this is a suite, not an op trace: run it with `gpurace run "
                       "FILE`"),
])
def test_the_wrong_command_on_a_document_says_what_it_is(command, path, words):
    result = CliRunner().invoke(main, [*command, str(path), "--backend", "sim"][
        :2 if command == ["check"] else None])
    assert result.exit_code == 2
    assert f"{path}:1:1: {words}" in result.output


def test_a_run_document_and_a_capture_file_are_known_by_their_first_line(tmp_path):
    assert document_kind('{"schema": "gpurace.run/1", "results": []}')[0] == \
        "a run document (run.json)"
    assert document_kind('["hello", {"schema": "gpurace.capture/1"}]\n')[0].startswith(
        "a capture file")
    assert document_kind("apiVersion: gpurace/v1\nkind: Suite\n")[0] == "a suite"
    assert document_kind("just text\n") is None and document_kind("{not json\n") is None


def test_a_json_message_names_its_column_once(tmp_path):
    from harness.errors import TraceError
    from harness.traces.optrace import load_trace
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type":"header","schema":"gpurace.trace/1","scenario":"x\n')
    with pytest.raises(TraceError) as caught:
        load_trace(bad)
    assert "(Unterminated string starting at column 56)" in str(caught.value)
    assert "at at" not in str(caught.value)


def test_check_on_a_folder_without_a_trace_says_what_it_takes(tmp_path):
    result = CliRunner().invoke(main, ["check", str(tmp_path)])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert f"{tmp_path} is a folder without a trace.jsonl: give an incident folder" in said
