"""A ticket's records: its header (the world it runs on) and its requests, each one turn of one
conversation, as :mod:`harness.traces.ticket` loads and writes them and the engine's batching
plan (:mod:`harness.traces.batching`) reads them. Records only: the file's checks are the loader's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TICKET_SCHEMA = "gpurace.ticket/1"
"""The schema version this gpurace reads and writes."""


@dataclass(frozen=True)
class TicketHeader:
    """What a ticket runs on: ``lanes`` concurrent lanes over a pool of ``pool_pages`` pages of
    ``page_tokens`` tokens, each token's KV ``leading x heads`` elements of ``dtype``."""

    name: str
    description: str | None
    lanes: int
    page_tokens: int
    pool_pages: int
    dtype: str
    leading: int
    heads: int
    source: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The header record, keys in file order; ``description`` and ``source`` only when set."""
        record: dict[str, Any] = {"type": "header", "schema": TICKET_SCHEMA, "name": self.name}
        if self.description is not None:
            record["description"] = self.description
        record.update(lanes=self.lanes, page_tokens=self.page_tokens, pool_pages=self.pool_pages,
                      kv={"dtype": self.dtype, "leading": self.leading, "heads": self.heads})
        if self.source is not None:
            record["source"] = self.source
        return record


@dataclass(frozen=True)
class Request:
    """One turn of one conversation: ``prefix_tokens`` of its prompt are cached from earlier
    turns, ``new_tokens`` are prefilled, then ``decode_tokens`` are decoded with
    ``draft_tokens`` speculative tokens at a time; ``end`` releases the conversation's pages."""

    id: int
    time_ms: float
    lane: int
    conversation: str
    turn: int
    prompt_tokens: int
    prefix_tokens: int
    new_tokens: int
    decode_tokens: int
    draft_tokens: int
    end: bool = False

    def to_json(self) -> dict[str, Any]:
        """The request record, keys in file order (``time_ms`` always a float, ``end`` always
        written, so the file reads the same whatever the caller passed)."""
        return {"type": "request", "id": self.id, "time_ms": float(self.time_ms),
                "lane": self.lane, "conversation": self.conversation, "turn": self.turn,
                "prompt_tokens": self.prompt_tokens, "prefix_tokens": self.prefix_tokens,
                "new_tokens": self.new_tokens, "decode_tokens": self.decode_tokens,
                "draft_tokens": self.draft_tokens, "end": self.end}

    @property
    def held_tokens(self) -> int:
        """Tokens the conversation's KV holds at this request's peak: the prompt, the decoded
        tokens and the speculative tail still to be verified."""
        return self.prompt_tokens + self.decode_tokens + self.draft_tokens


@dataclass(frozen=True)
class Ticket:
    """A loaded ticket. ``path`` is where it was read from or written to; it takes no part in
    equality, so a ticket written elsewhere and loaded back compares equal to the original."""

    header: TicketHeader
    requests: tuple[Request, ...]
    path: Path | None = field(default=None, compare=False)

    def conversations(self) -> dict[str, tuple[Request, ...]]:
        """Each conversation's requests in turn order, conversations in order of first request."""
        grouped: dict[str, list[Request]] = {}
        for request in self.requests:
            grouped.setdefault(request.conversation, []).append(request)
        return {name: tuple(requests) for name, requests in grouped.items()}

    def peak_pages(self) -> int:
        """The most pages the ticket's live conversations hold at once, if each holds
        ``ceil(held_tokens / page_tokens)`` pages from its latest request until its end.

        An estimate for sizing ``pool_pages`` (the replay engine has the final word): keep
        ``pool_pages`` comfortably above it.
        """
        page_tokens = self.header.page_tokens
        held: dict[str, int] = {}
        peak = 0
        for request in self.requests:
            held[request.conversation] = -(-request.held_tokens // page_tokens)
            peak = max(peak, sum(held.values()))
            if request.end:
                del held[request.conversation]
        return peak
