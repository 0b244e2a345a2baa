"""How an engine batches a ticket's requests: its lanes are batch slots, run step by step.

The replay engine (the executor's ticket workload) and `gpurace minimize` (which turns a ticket
into scenario steps) both follow this plan, so a minimized scenario does what the replay did.

Admission is first come, first served: requests are admitted in ticket order, each as soon as its
lane is free; a request whose lane is busy holds back the ones after it, as a FCFS scheduler does.
Every engine step then works on each busy lane in lane order: a request's first step prefills
(new pages for the tokens its conversation does not hold yet), re-activates the conversation's
catalog (its page list republished into the lane's table row) and decodes once; each later step
decodes once more. A decode step verifies ``1 + draft_tokens`` tokens, so a request takes
``ceil(decode_tokens / (1 + draft_tokens))`` decode steps (at most :data:`DECODE_STEPS_CAP`).
After each step the engine waits for its tokens; then a request that is done frees its lane, and
a conversation that ended releases its pages, which the next prefill may reuse.

Times in the ticket order the admissions; the replay runs as fast as the device allows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from harness.traces.requests import Request, Ticket

DECODE_STEPS_CAP = 16
"""Decode steps per request at most: each reads the row again; more add time, not cover."""


@dataclass(frozen=True)
class LaneWork:
    """What one busy lane does in one engine step. ``number`` is the request's place in the
    ticket, from 1; ``opens`` a new conversation (a catalog bound to the lane's row);
    ``new_pages`` to prefill; ``activate`` on the request's first step."""

    number: int
    request: Request
    opens: bool
    new_pages: int
    activate: bool


@dataclass(frozen=True)
class EngineStep:
    """One engine step: the lanes' work, then (after the wait) the conversations that ended and
    release their pages. ``admitted`` is how many requests the engine had taken by then."""

    work: tuple[LaneWork, ...]
    releases: tuple[str, ...]
    admitted: int

    @property
    def in_flight(self) -> tuple[int, ...]:
        return tuple(w.number for w in self.work)


def decode_steps(request: Request) -> int:
    return max(1, min(-(-request.decode_tokens // (1 + request.draft_tokens)), DECODE_STEPS_CAP))


def plan(ticket: Ticket) -> Iterator[EngineStep]:
    """The engine steps that serve ``ticket``, in order."""
    page_tokens = ticket.header.page_tokens
    pending = deque(enumerate(ticket.requests, 1))
    held: dict[str, int] = {}  # conversation -> pages its catalog holds
    busy: dict[int, tuple[int, Request, int]] = {}  # lane -> (number, request, steps left)
    admitted = 0
    while pending or busy:
        fresh: set[int] = set()
        while pending and pending[0][1].lane not in busy:
            number, request = pending.popleft()
            busy[request.lane] = (number, request, decode_steps(request))
            fresh.add(request.lane)
            admitted = number
        work = []
        for lane in sorted(busy):
            number, request, _ = busy[lane]
            first = lane in fresh
            have = held.get(request.conversation)
            new_pages = 0
            if first:
                need = -(-(request.prompt_tokens + request.decode_tokens) // page_tokens)
                new_pages = max(0, need - (have or 0))
                held[request.conversation] = max(need, have or 0)
            work.append(LaneWork(number, request, opens=first and have is None,
                                 new_pages=new_pages, activate=first))
        releases = []
        for lane in sorted(busy):
            number, request, left = busy[lane]
            if left > 1:
                busy[lane] = (number, request, left - 1)
                continue
            del busy[lane]
            if request.end:
                releases.append(request.conversation)
                del held[request.conversation]
        yield EngineStep(tuple(work), tuple(releases), admitted)
