"""Tickets (harness/traces/ticket.py): every bad ticket is refused at its line and field with a
message that says what to do; good ones round-trip; the committed ninfer-210 ticket has the promised
shape and is exactly what its generator makes."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from jsonl_columns import prefix

from harness.errors import TraceError
from harness.traces.ticket import (
    KV_DTYPES,
    TICKET_SCHEMA,
    Request,
    Ticket,
    TicketHeader,
    load_ticket,
    write_ticket,
)

TICKETS = Path(__file__).resolve().parent.parent / "scenarios" / "tickets"
NINFER_210 = TICKETS / "ninfer-210.jsonl"

HEADER: dict[str, Any] = {"type": "header", "schema": TICKET_SCHEMA, "name": "tiny",
                          "lanes": 2, "page_tokens": 64, "pool_pages": 16,
                          "kv": {"dtype": "i8", "leading": 8, "heads": 2}}


def req(id: int, conversation: str = "a", turn: int = 1, *, lane: int = 0,
        time_ms: float | None = None, prompt: int = 100, prefix: int = 0,
        end: bool = False, **extra: Any) -> dict[str, Any]:
    """A valid request record (new_tokens follows from prompt and prefix); ``extra`` overrides
    or adds keys."""
    record: dict[str, Any] = {
        "type": "request", "id": id, "time_ms": float(id) if time_ms is None else time_ms,
        "lane": lane, "conversation": conversation, "turn": turn, "prompt_tokens": prompt,
        "prefix_tokens": prefix, "new_tokens": prompt - prefix, "decode_tokens": 4,
        "draft_tokens": 3, "end": end}
    record.update(extra)
    return record


def dump(path: Path, records: list[Any], *, raw: dict[int, str] | None = None,
         newline: bool = True) -> Path:
    """Write records as JSON Lines; ``raw`` replaces given 1-based lines with literal text."""
    lines = [json.dumps(r) for r in records]
    for number, text in (raw or {}).items():
        lines[number - 1] = text
    path.write_text("\n".join(lines) + ("\n" if newline else ""), encoding="utf-8")
    return path


def refused(path: Path, line: int, field: str, phrase: str) -> str:
    """Load ``path``, expecting a TraceError at ``line`` and ``field`` that says ``phrase``."""
    with pytest.raises(TraceError) as caught:
        load_ticket(path)
    message = str(caught.value)
    assert message.startswith(prefix(path, line, field)), message
    assert phrase in message, message
    return message


def _without(record: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != key}


# Each bad ticket: its records, then the line, field and phrase its error must have.
BAD: dict[str, tuple[Callable[[], list[Any]], int, str, str]] = {
    "non-object record": (lambda: [HEADER, [1, 2]], 2, "(record)",
                          "must be a JSON object, not an array"),
    "missing type": (lambda: [HEADER, _without(req(0), "type")], 2, "type", "missing"),
    "first line not a header": (lambda: [req(0)], 1, "type",
                                "the first record must be the header"),
    "schema version 2": (lambda: [{**HEADER, "schema": "gpurace.ticket/2"}], 1, "schema",
                         "gpurace.ticket/2 is not supported; this gpurace reads "
                         "gpurace.ticket/1"),
    "an op trace's schema": (lambda: [{**HEADER, "schema": "gpurace.trace/1"}], 1, "schema",
                             "is not a ticket schema"),
    "missing schema": (lambda: [_without(HEADER, "schema")], 1, "schema", "missing"),
    "unknown record type": (lambda: [HEADER, req(0), {"type": "op", "seq": 1}], 3, "type",
                            "unknown record type 'op'; a ticket has header and request records"),
    "second header": (lambda: [HEADER, req(0), HEADER], 3, "type",
                      "a second header (the first is on line 1)"),
    "header missing pool_pages": (lambda: [_without(HEADER, "pool_pages")], 1, "pool_pages",
                                  "missing"),
    "request missing prompt_tokens": (lambda: [HEADER, _without(req(0), "prompt_tokens")], 2,
                                      "prompt_tokens", "missing; a request needs"),
    "bool lane": (lambda: [HEADER, req(0, lane=True)], 2, "lane",
                  "must be an integer, not true"),
    "string turn": (lambda: [HEADER, req(0, turn="1")], 2, "turn",
                    'must be an integer, not "1" (a string)'),
    "float id": (lambda: [HEADER, {**req(0), "id": 1.0}], 2, "id", "must be an integer"),
    "string time": (lambda: [HEADER, req(0, time_ms="0")], 2, "time_ms",
                    "must be a number of milliseconds"),
    "negative time": (lambda: [HEADER, req(0, time_ms=-1.0)], 2, "time_ms", "0 or more"),
    "negative decode_tokens": (lambda: [HEADER, req(0, decode_tokens=-1)], 2, "decode_tokens",
                               "must be 0 or more, not -1"),
    "negative draft_tokens": (lambda: [HEADER, req(0, draft_tokens=-3)], 2, "draft_tokens",
                              "must be 0 or more"),
    "lane out of range": (lambda: [HEADER, req(0, lane=2)], 2, "lane",
                          "2 is out of range: the header declares 2 lane(s)"),
    "prefix over prompt": (lambda: [HEADER, req(0, prompt=100, prefix=150)], 2, "prefix_tokens",
                           "150 exceeds prompt_tokens 100"),
    "new_tokens mismatch": (lambda: [HEADER, req(0, new_tokens=90)], 2, "new_tokens",
                            "must be prompt_tokens - prefix_tokens = 100, not 90"),
    "first turn not 1": (lambda: [HEADER, req(0, turn=2)], 2, "turn",
                         "starts here, so this is turn 1, not 2"),
    "turn skipped": (lambda: [HEADER, req(0), req(1, turn=3)], 3, "turn",
                     "was at turn 1 on line 2, so this is turn 2, not 3"),
    "turn repeated": (lambda: [HEADER, req(0), req(1, turn=1)], 3, "turn", "not 1"),
    "conversation changes lane": (lambda: [HEADER, req(0), req(1, turn=2, lane=1)], 3, "lane",
                                  "runs on lane 0 (line 2), not 1"),
    "conversation after its end": (lambda: [HEADER, req(0, end=True), req(1, turn=2)], 3,
                                   "conversation", "ended on line 2"),
    "id repeated": (lambda: [HEADER, req(5), req(5, "b")], 3, "id", "5 repeats id 5 on line 2"),
    "id going back": (lambda: [HEADER, req(5), req(4, "b")], 3, "id",
                      "4 goes back from id 5 on line 2"),
    "time going back": (lambda: [HEADER, req(0, time_ms=10.0), req(1, "b", time_ms=9.5)], 3,
                        "time_ms", "9.5 is before 10.0 on line 2"),
    "unknown request key": (lambda: [HEADER, req(0, lanes=0)], 2, "lanes",
                            "unknown key; did you mean 'lane'?"),
    "unknown header key": (lambda: [{**HEADER, "color": "red"}], 1, "color", "unknown key"),
    "unknown kv key": (lambda: [{**HEADER, "kv": {**HEADER["kv"], "align": 256}}], 1,
                       "kv.align", "unknown key"),
    "kv not an object": (lambda: [{**HEADER, "kv": "i8"}], 1, "kv", "must be an object"),
    "unknown dtype": (lambda: [{**HEADER, "kv": {**HEADER["kv"], "dtype": "int4"}}], 1,
                      "kv.dtype", "unknown dtype 'int4'; use one of i8, fp8, f16, bf16, f32"),
    "zero heads": (lambda: [{**HEADER, "kv": {**HEADER["kv"], "heads": 0}}], 1, "kv.heads",
                   "must be 1 or more"),
    "zero lanes": (lambda: [{**HEADER, "lanes": 0}], 1, "lanes", "must be 1 or more, not 0"),
    "bad name": (lambda: [{**HEADER, "name": "Ninfer 210"}], 1, "name",
                 "'Ninfer 210' is not a ticket name"),
    "description not a string": (lambda: [{**HEADER, "description": 3}], 1, "description",
                                 "must be a string"),
    "empty conversation": (lambda: [HEADER, req(0, "")], 2, "conversation", "must not be empty"),
    "end not a bool": (lambda: [HEADER, req(0, end=1)], 2, "end", "must be true or false"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_ticket_is_refused_at_its_line_and_field(tmp_path: Path, case: str) -> None:
    records, line, field, phrase = BAD[case]
    refused(dump(tmp_path / "t.jsonl", records()), line, field, phrase)


def test_a_line_that_is_not_json_is_reported_as_such(tmp_path: Path) -> None:
    path = dump(tmp_path / "t.jsonl", [HEADER, req(0), req(1, turn=2)],
                raw={2: '{"type": "request", "id": 0, "time_ms": 0.0, "la'})
    message = refused(path, 2, "(record)", "truncated or not JSON")
    assert "ends mid-record" not in message  # the file itself goes on


def test_a_truncated_last_line_says_the_file_ends_mid_record(tmp_path: Path) -> None:
    whole = json.dumps(req(1, turn=2))
    path = dump(tmp_path / "t.jsonl", [HEADER, req(0), req(1, turn=2)],
                raw={3: whole[:len(whole) // 2]}, newline=False)
    refused(path, 3, "(record)", "truncated or not JSON (the file ends mid-record")


def test_duplicate_keys_and_nan_are_refused(tmp_path: Path) -> None:
    head = json.dumps(HEADER)
    path = tmp_path / "dup.jsonl"
    path.write_text(head + "\n" + json.dumps(req(0))[:-1] + ', "lane": 1}\n')
    refused(path, 2, "lane", "appears twice")
    path.write_text(head + "\n" + json.dumps(req(0, time_ms=math.nan)) + "\n")
    refused(path, 2, "(record)", "NaN is not a JSON number")


def test_unreadable_empty_and_non_utf8_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    refused(missing, 1, "(file)", "cannot read the file")
    refused(tmp_path, 1, "(file)", "a folder, not a file; pass a ticket")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    refused(empty, 1, "(file)", "empty file; a ticket starts with a header line")
    empty.write_text("\n  \n")
    refused(empty, 1, "(file)", "empty file")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(json.dumps(HEADER).encode() + b"\n\xff\xfe\n")
    refused(binary, 2, "(record)", "not UTF-8 text")


def test_trace_errors_exit_with_code_2(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as caught:
        load_ticket(tmp_path / "missing.jsonl")
    assert caught.value.exit_code == 2


def test_a_good_ticket_loads(tmp_path: Path) -> None:
    path = dump(tmp_path / "t.jsonl", [
        {**HEADER, "description": "two lanes", "source": "hand-written"},
        req(0, "a", 1, prompt=100),
        req(1, "b", 1, lane=1, prompt=50, time_ms=1),  # an integer time is a number too
        "",  # a blank line carries nothing
        req(2, "a", 2, prompt=130, prefix=104, end=True),
        req(7, "c", 1, lane=0, prompt=10),  # ids increase, not necessarily by one
    ], raw={4: ""})
    ticket = load_ticket(path)
    assert ticket.path == path
    assert ticket.header == TicketHeader("tiny", "two lanes", 2, 64, 16, "i8", 8, 2,
                                         "hand-written")
    assert [r.id for r in ticket.requests] == [0, 1, 2, 7]
    assert ticket.requests[1].time_ms == 1.0 and isinstance(ticket.requests[1].time_ms, float)
    assert ticket.requests[2] == Request(2, 2.0, 0, "a", 2, 130, 104, 26, 4, 3, True)
    assert list(ticket.conversations()) == ["a", "b", "c"]
    # a: ceil(137/64) = 3 pages, b: ceil(57/64) = 1; a's pages go back at its end
    assert ticket.peak_pages() == 4


def test_to_json_gives_the_record_form() -> None:
    header = TicketHeader("ninfer-210", None, 2, 64, 256, "i8", 8, 2)
    assert header.to_json() == {"type": "header", "schema": "gpurace.ticket/1",
                                "name": "ninfer-210", "lanes": 2, "page_tokens": 64,
                                "pool_pages": 256,
                                "kv": {"dtype": "i8", "leading": 8, "heads": 2}}
    request = Request(0, 0, 0, "agent", 1, 7000, 0, 7000, 64, 3)
    assert json.dumps(request.to_json()) == (
        '{"type": "request", "id": 0, "time_ms": 0.0, "lane": 0, "conversation": "agent", '
        '"turn": 1, "prompt_tokens": 7000, "prefix_tokens": 0, "new_tokens": 7000, '
        '"decode_tokens": 64, "draft_tokens": 3, "end": false}')


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    header = TicketHeader("round-trip", "desc \u00e9 \"quoted\"", 2, 16, 32, "bf16", 128, 8,
                          "unit test")
    requests = (Request(0, 0, 0, "a", 1, 100, 0, 100, 4, 3),
                Request(1, 0.1 + 0.2, 1, "b \u2028 x", 1, 5, 0, 5, 0, 0, True),
                Request(2, 12.5, 0, "a", 2, 130, 104, 26, 4, 3, True))
    path = tmp_path / "out.jsonl"
    written = write_ticket((header, requests), path)
    loaded = load_ticket(path)
    assert loaded == written == Ticket(header, requests)
    assert loaded.path == written.path == path
    assert loaded.requests[1].time_ms == 0.1 + 0.2  # floats survive exactly
    # Writing what was loaded gives the same bytes.
    again = write_ticket(loaded, tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_bytes() == path.read_bytes()
    assert again == loaded


def test_write_refuses_an_invalid_ticket_and_leaves_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keep.jsonl"
    path.write_text("old\n")
    header = TicketHeader("tiny", None, 1, 64, 16, "i8", 8, 2)
    bad = (Request(0, 0.0, 0, "a", 1, 100, 0, 100, 4, 3),
           Request(1, 1.0, 1, "b", 1, 10, 0, 10, 4, 3))  # lane 1 of a 1-lane ticket
    lane = json.dumps(bad[1].to_json()).index('"lane":') + 1  # where line 3 would say it
    with pytest.raises(TraceError, match=rf"^{path}:3:{lane}: lane: 1 is out of range"):
        write_ticket((header, bad), path)
    with pytest.raises(TraceError, match=rf"^{path}:2:1: \(record\): cannot be written as "
                                         "JSON"):
        write_ticket((header, (Request(0, math.inf, 0, "a", 1, 1, 0, 1, 0, 0),)), path)
    assert path.read_text() == "old\n"
    assert not [p for p in tmp_path.iterdir() if p.name != "keep.jsonl"]  # no temp left


def test_kv_dtypes_are_kvcores() -> None:
    assert KV_DTYPES == ("i8", "fp8", "f16", "bf16", "f32")


# -- the ninfer-210 ticket ---------------------------------------------------------------------


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_ninfer_210",
                                                  TICKETS / "make_ninfer_210.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ninfer_210_has_the_reported_shape() -> None:
    ticket = load_ticket(NINFER_210)
    header = ticket.header
    assert (header.name, header.lanes, header.page_tokens) == ("ninfer-210", 2, 64)
    assert (header.dtype, header.leading, header.heads) == ("i8", 8, 2)
    assert "ninfer #210" in (header.source or "") and "1/16" in (header.source or "")
    assert header.description
    assert 100 <= len(ticket.requests) <= 130
    assert {r.draft_tokens for r in ticket.requests} == {3}
    times = [r.time_ms for r in ticket.requests]
    assert times == sorted(times)

    conversations = ticket.conversations()
    agent = conversations.pop("agent")
    assert {r.lane for r in agent} == {0}
    assert 55 <= len(agent) <= 65  # past request 54, where real traffic crashed
    assert 7000 <= agent[0].prompt_tokens <= 7400  # ~115k / 16
    for before, turn in zip(agent, agent[1:]):
        assert turn.prefix_tokens == before.prompt_tokens + before.decode_tokens
        assert turn.prefix_tokens / turn.prompt_tokens >= 0.99
    mean_new = sum(r.new_tokens for r in agent[1:]) / (len(agent) - 1)
    assert 28 <= mean_new <= 38  # ~531 / 16

    # Lane 1: short conversations that all end, so their pages are released and reused.
    assert len(conversations) >= 10
    for name, requests in conversations.items():
        assert {r.lane for r in requests} == {1}, name
        assert 3 <= len(requests) <= 5, name
        assert requests[-1].end and not any(r.end for r in requests[:-1]), name
    # About one lane-1 request per agent turn, and the lanes interleave.
    lane1 = sum(len(requests) for requests in conversations.values())
    assert abs(lane1 - len(agent)) <= 6
    lanes = [r.lane for r in ticket.requests[:54]]
    assert sum(a != b for a, b in zip(lanes, lanes[1:])) >= 40

    assert ticket.peak_pages() + 32 <= header.pool_pages  # fits with margin


def test_generator_reproduces_the_committed_ticket(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    generator = _generator()
    out = tmp_path / "ninfer-210.jsonl"
    assert generator.main(["--out", str(out)]) == 0
    assert out.read_bytes() == NINFER_210.read_bytes()
    assert "60 agent turns" in capsys.readouterr().out
    assert generator.build() == load_ticket(NINFER_210)
    assert generator.build(seed=1) != generator.build()  # the seed, not luck, fixes it
