"""Make ``ninfer-210.jsonl``: a synthetic ticket with the shape of the traffic in ninfer #210.

The report describes a coding-agent session whose every turn re-activates a retained KV catalog
(a 99.5% prefix hit on a ~115k-token context, ~531 new tokens a turn) next to a small concurrent
second lane, max concurrency 2, int8 KV and 3 draft tokens; it crashed at request 54. This ticket
keeps that shape at 1/16 of the tokens so that a replay runs in seconds:

- lane 0, conversation ``agent``: 60 turns, the first prefilling 115000/16 tokens, each later one
  hitting the previous prompt and its decoded tokens (~99.5% of its prompt) and adding ~33 new
  tokens, decoding 8; the session ends with its last turn.
- lane 1: short conversations ``chat-01``, ``chat-02``... of 3 to 5 turns that end, so their
  pages go back to the pool and are reused; about one request per agent turn, between them.

Times are compressed too (20-60 ms between agent turns). The output is deterministic (a
seeded ``random.Random``); run this again after changing it and commit both files::

    python scenarios/tickets/make_ninfer_210.py [--out PATH]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from harness.traces.ticket import Request, Ticket, TicketHeader, write_ticket

TICKET = Path(__file__).resolve().parent / "ninfer-210.jsonl"
SEED = 210
SCALE = 16

AGENT_TURNS = 60  # real traffic crashed at request 54; carry the session past it
AGENT_CONTEXT = 115_000 // SCALE  # the first turn's prompt: the agent's whole context
AGENT_NEW = (24, 42)  # new tokens a turn, ~531/16 = 33 on average
AGENT_DECODE = 8
CHAT_TURNS = (3, 5)
CHAT_FIRST = (256, 768)  # a chat's opening prompt
CHAT_NEW = (16, 96)  # a chat's later turns
CHAT_DECODE = (4, 6)
DRAFT_TOKENS = 3
GAP_MS = (20.0, 60.0)  # between agent turns


def build(seed: int = SEED) -> Ticket:
    """The ticket, from ``seed`` alone."""
    rng = random.Random(seed)
    header = TicketHeader(
        name="ninfer-210",
        description=(f"a coding-agent session (lane 0, {AGENT_TURNS} turns, ~99.5% prefix hits "
                     "on a growing context) beside short conversations that end on a concurrent "
                     "second lane (lane 1); int8 KV, 3 draft tokens; real traffic crashed at "
                     "request 54"),
        lanes=2,
        page_tokens=64,
        # The agent's final context is ~151 pages and a chat at most ~19: 256 leaves a margin
        # of ~85 pages, so the replay never runs out of pool (peak_pages() checks it).
        pool_pages=256,
        dtype="i8",
        leading=8,
        heads=2,
        source="synthetic, from the shape reported in ninfer #210; scaled 1/16",
    )

    # The agent's turn times, and one more as the end of the last gap.
    times = [0.0]
    for _ in range(AGENT_TURNS):
        times.append(round(times[-1] + rng.uniform(*GAP_MS), 1))

    # (time_ms, lane, fields) for every request; ids are given once both lanes are merged.
    events: list[tuple[float, int, dict[str, object]]] = []
    prompt, decode = 0, 0
    for turn in range(1, AGENT_TURNS + 1):
        new = AGENT_CONTEXT if turn == 1 else rng.randint(*AGENT_NEW)
        prefix = 0 if turn == 1 else prompt + decode
        prompt, decode = prefix + new, AGENT_DECODE
        events.append((times[turn - 1], 0, dict(
            conversation="agent", turn=turn, prompt_tokens=prompt, prefix_tokens=prefix,
            new_tokens=new, decode_tokens=decode, end=turn == AGENT_TURNS)))

    # Lane 1: whole conversations, as many as fit in one request per agent turn, placed in
    # randomly chosen gaps between agent turns so the lanes interleave.
    lengths: list[int] = []
    while True:
        length = rng.randint(*CHAT_TURNS)
        if sum(lengths) + length > AGENT_TURNS:
            break
        lengths.append(length)
    slots = iter(sorted(rng.sample(range(AGENT_TURNS), sum(lengths))))
    for number, length in enumerate(lengths, 1):
        prompt, decode = 0, 0
        for turn in range(1, length + 1):
            new = rng.randint(*CHAT_FIRST) if turn == 1 else rng.randint(*CHAT_NEW)
            prefix = 0 if turn == 1 else prompt + decode
            prompt, decode = prefix + new, rng.randint(*CHAT_DECODE)
            slot = next(slots)
            at = round(times[slot] + rng.uniform(0.25, 0.75) * (times[slot + 1] - times[slot]), 1)
            events.append((at, 1, dict(
                conversation=f"chat-{number:02d}", turn=turn, prompt_tokens=prompt,
                prefix_tokens=prefix, new_tokens=new, decode_tokens=decode,
                end=turn == length)))

    events.sort(key=lambda event: (event[0], event[1]))
    requests = tuple(Request(id=index, time_ms=at, lane=lane, draft_tokens=DRAFT_TOKENS,
                             **fields)  # type: ignore[arg-type]
                     for index, (at, lane, fields) in enumerate(events))
    return Ticket(header, requests)


def main(argv: list[str] | None = None) -> int:
    """Write the ticket (to ``--out``, by default next to this script) and sum it up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TICKET, help=f"default: {TICKET}")
    args = parser.parse_args(argv)
    ticket = write_ticket(build(), args.out)
    agent = ticket.conversations()["agent"]
    print(f"{args.out}: {len(ticket.requests)} requests, {len(agent)} agent turns, "
          f"{len(ticket.conversations()) - 1} lane-1 conversations, peak "
          f"{ticket.peak_pages()} of {ticket.header.pool_pages} pages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
