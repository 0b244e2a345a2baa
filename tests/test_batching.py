"""The engine's batching plan: lanes are batch slots, admission is first come first served, and
the replay and minimize's steps both follow the plan."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from harness.traces import batching
from harness.cli import main
from harness.analyses.minimize import steps_for
from harness.lang.targets import SCENARIO_ROOT
from harness.traces.ticket import Request, Ticket, TicketHeader, load_ticket

TICKET = SCENARIO_ROOT / "tickets" / "ninfer-210.jsonl"
HEADER = TicketHeader("t", None, lanes=2, page_tokens=64, pool_pages=64, dtype="i8", leading=8,
                      heads=2)


def req(i: int, lane: int, conversation: str, turn: int, prompt: int, prefix: int = 0,
        decode: int = 4, draft: int = 3, end: bool = False) -> Request:
    return Request(i, float(i), lane, conversation, turn, prompt, prefix, prompt - prefix, decode,
                   draft, end)


def test_free_lanes_are_admitted_together_and_run_in_one_step() -> None:
    ticket = Ticket(HEADER, (req(0, 0, "a", 1, 100), req(1, 1, "b", 1, 60)))
    [step] = list(batching.plan(ticket))
    assert step.in_flight == (1, 2) and step.admitted == 2
    assert [(w.opens, w.new_pages, w.activate) for w in step.work] == [(True, 2, True),
                                                                       (True, 1, True)]


def test_a_busy_lane_holds_back_the_requests_after_its_next_one() -> None:
    # Request 1 decodes 3 steps (12 tokens, 4 a step); request 2 waits for lane 0, and request
    # 3 (lane 1, free all along) waits behind it: first come, first served.
    ticket = Ticket(HEADER, (req(0, 0, "a", 1, 64, decode=12), req(1, 0, "a", 2, 128, 64),
                             req(2, 1, "b", 1, 64)))
    steps = list(batching.plan(ticket))
    assert [s.in_flight for s in steps] == [(1,), (1,), (1,), (2, 3)]
    assert [s.admitted for s in steps] == [1, 1, 1, 3]


def test_pages_follow_the_conversation_and_go_back_when_it_ends() -> None:
    ticket = Ticket(HEADER, (req(0, 0, "a", 1, 100), req(1, 0, "a", 2, 200, 100, end=True),
                             req(2, 0, "c", 1, 10)))
    steps = list(batching.plan(ticket))
    work = [w for s in steps for w in s.work if w.activate]
    # ceil((100 + 4) / 64) = 2 pages, then ceil(204 / 64) = 4: 2 more; c opens afresh.
    assert [(w.number, w.opens, w.new_pages) for w in work] == [(1, True, 2), (2, False, 2),
                                                               (3, True, 1)]
    assert [s.releases for s in steps] == [(), ("a",), ()]


def test_decode_steps_verify_one_plus_the_drafts_each() -> None:
    assert batching.decode_steps(req(0, 0, "a", 1, 10, decode=8, draft=3)) == 2
    assert batching.decode_steps(req(0, 0, "a", 1, 10, decode=9, draft=3)) == 3
    assert batching.decode_steps(req(0, 0, "a", 1, 10, decode=0, draft=3)) == 1
    assert batching.decode_steps(req(0, 0, "a", 1, 10, decode=10_000, draft=0)) == \
        batching.DECODE_STEPS_CAP


def test_ninfer_210_runs_two_lanes_at_once_and_serves_every_request_once() -> None:
    ticket = load_ticket(TICKET)
    steps = list(batching.plan(ticket))
    firsts = [w.number for s in steps for w in s.work if w.activate]
    assert firsts == list(range(1, len(ticket.requests) + 1))
    assert sum(len(s.work) == 2 for s in steps) > len(steps) // 2  # mostly two lanes at once
    ended = [r.conversation for r in ticket.requests if r.end]
    assert [c for s in steps for c in s.releases] == ended


def test_the_replay_and_minimizes_steps_read_the_table_alike(tmp_path: Path) -> None:
    """The replay engine and the scenario steps minimize makes from a ticket follow one plan:
    as many table reads and activations."""
    result = CliRunner().invoke(main, ["replay", str(TICKET), "--backend", "sim", "--record",
                                       "--format", "json", "--out", str(tmp_path)])
    [trace] = json.loads(result.stdout)["results"][0]["traces"]
    ops = [json.loads(line) for line in Path(trace).read_text().splitlines()[1:]]
    kinds = [o["kind"] for o in ops if o["type"] == "op"]
    steps = steps_for(load_ticket(TICKET))
    assert kinds.count("kernel:read_table") == sum(s["op"] == "read_table" for s in steps)
    activations = sum(s["op"] == "activate" for s in steps)
    assert activations == len(load_ticket(TICKET).requests)
