"""Tickets: request-level traces of inference traffic, to replay against the KV page pool.

A ticket is JSON Lines: a header record, then one request per line in time order::

    {"type": "header", "schema": "gpurace.ticket/1", "name": "ninfer-210", "lanes": 2,
     "page_tokens": 64, "pool_pages": 256, "kv": {"dtype": "i8", "leading": 8, "heads": 2}}
    {"type": "request", "id": 0, "time_ms": 0.0, "lane": 0, "conversation": "agent",
     "turn": 1, "prompt_tokens": 7000, "prefix_tokens": 0, "new_tokens": 7000,
     "decode_tokens": 64, "draft_tokens": 3, "end": false}

(each record on one line in the file). A request is one turn of one conversation: its prompt is
``prefix_tokens`` already cached from earlier turns plus ``new_tokens`` to prefill, after which it
decodes ``decode_tokens`` with ``draft_tokens`` speculative tokens in flight. A conversation
keeps its lane, counts its turns from 1, and with ``"end": true`` releases its pages for good.

:func:`load_ticket` reads and checks one; every problem is a :class:`~harness.errors.TraceError`
whose message starts with ``file:line:col: field:`` and says what to change. :func:`write_ticket`
writes one atomically, checked by the same rules, so whatever it writes loads back equal.
Besides each record, the checks cover what the replay engine would meet: the world the header
asks for (within :mod:`harness.limits`), and, by running the engine's batching plan
(:mod:`harness.traces.batching`), that the pages live conversations hold never exceed the pool
(:meth:`Ticket.peak_pages` gives an author the estimate to size ``pool_pages`` by).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.traces import batching
from harness import limits as L
from harness.lang.footprint import Footprint
from harness.inputs import clip, echo, plain
from harness.traces.jsonl import LineParser, line_error, read_text, show
# The records, here as before for the code that imports them from this module.
from harness.traces.requests import TICKET_SCHEMA, Request, Ticket, TicketHeader
from kvcore.geometry import DType, KVPageGeometry, KVPlaneGeometry
from reports import write_atomic

KV_DTYPES = tuple(member.label for member in DType)
"""The KV element types a ticket may name: kvcore's, so a ticket never names one the pool lacks."""

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

_HEADER_KEYS = ("type", "schema", "name", "description", "lanes", "page_tokens", "pool_pages",
                "kv", "source")
_HEADER_REQUIRED = ("schema", "name", "lanes", "page_tokens", "pool_pages", "kv")
_KV_KEYS = ("dtype", "leading", "heads")
_REQUEST_KEYS = ("type", "id", "time_ms", "lane", "conversation", "turn", "prompt_tokens",
                 "prefix_tokens", "new_tokens", "decode_tokens", "draft_tokens", "end")
_TOKEN_FIELDS = ("prompt_tokens", "prefix_tokens", "new_tokens", "decode_tokens", "draft_tokens")


def load_ticket(path: Path | str) -> Ticket:
    """Read and check the ticket at ``path``.

    Raises :class:`TraceError` for the first problem found, as ``path:line: field: what is
    wrong and what to do``; fix that line and load again.
    """
    path = Path(path)
    text = read_text(path, "a ticket", L.TICKET_MAX_BYTES)
    return _parse(path, text)


def write_ticket(ticket: Ticket | tuple[TicketHeader, Sequence[Request]],
                 path: Path | str) -> Ticket:
    """Write ``ticket`` (a :class:`Ticket`, or a header and its requests) to ``path``
    atomically, and return it as :func:`load_ticket` would read it back.

    The records are checked by the same rules as :func:`load_ticket` before anything is
    written, so an invalid ticket raises :class:`TraceError` (naming the line it would have
    been on) and leaves ``path`` untouched.
    """
    path = Path(path)
    header, requests = (ticket.header, ticket.requests) if isinstance(ticket, Ticket) else ticket
    lines = []
    for number, record in enumerate([header.to_json(), *(r.to_json() for r in requests)], 1):
        try:
            lines.append(json.dumps(record, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise line_error(path, number, 1, "(record)",
                             f"cannot be written as JSON ({exc}); use strings, booleans and "
                             "finite numbers") from exc
    text = "\n".join(lines) + "\n"
    checked = _parse(path, text)
    write_atomic(path, text)
    return checked


class _Parser(LineParser):
    """Checks one ticket's records in order; ``fail`` raises the error for the current line."""
    reads = "a ticket"

    remedy = "remake the ticket or fix this line"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.header: TicketHeader | None = None
        self.header_line = 0
        self.requests: list[Request] = []
        self.request_lines: list[int] = []
        # conversation -> (lane, last turn, line of last request, line of its end or 0)
        self.conversations: dict[str, tuple[int, int, int, int]] = {}

    # -- one record ------------------------------------------------------------------------

    def record(self, record: dict[str, Any]) -> None:
        if "type" not in record:
            raise self.fail("type", 'missing; every record needs "type": "header" or '
                                    '"request"')
        kind = record["type"]
        if not isinstance(kind, str):
            raise self.fail("type", f'must be "header" or "request", not {show(kind)}')
        if kind not in ("header", "request"):
            raise self.fail("type", f"unknown record type {echo(kind)}; a ticket has header and "
                                    "request records")
        if self.header is None:
            if kind != "header":
                raise self.fail("type", f"the first record must be the header "
                                        f'({{"type": "header", "schema": "{TICKET_SCHEMA}", '
                                        f"...}}), not a {kind}; add the header as line 1")
            self.read_header(record)
        elif kind == "header":
            raise self.fail("type", f"a second header (the first is on line {self.header_line}); "
                                    "a ticket has one header, on its first line: split "
                                    "concatenated tickets into separate files")
        else:
            self.read_request(record)

    def read_header(self, record: dict[str, Any]) -> None:
        # The schema first: a ticket of another version may legitimately have other keys,
        # and "this version is not supported" is the useful thing to say about it.
        if "schema" not in record:
            raise self.fail("schema", f'missing; a ticket header starts with "type": "header", '
                                      f'"schema": "{TICKET_SCHEMA}"')
        schema = record["schema"]
        if not isinstance(schema, str):
            raise self.fail("schema", f'must be the string "{TICKET_SCHEMA}", not '
                                      f"{show(schema)}")
        if schema != TICKET_SCHEMA:
            if schema.startswith("gpurace.ticket/"):
                raise self.fail("schema", f"{clip(plain(schema))} is not supported; this "
                                          f"gpurace reads {TICKET_SCHEMA}")
            raise self.fail("schema", f"{echo(schema)} is not a ticket schema; this gpurace reads "
                                      f"{TICKET_SCHEMA} (an op trace goes to `gpurace check`)")
        self.check_keys(record, _HEADER_KEYS, _HEADER_REQUIRED, "header")
        name = self.string(record, "name", limit=L.NAME_MAX_CHARS)
        if not NAME_PATTERN.match(name):
            raise self.fail("name", f"{echo(name)} is not a ticket name; use lowercase letters, "
                                    "digits, '-' and '_', starting with a letter or digit")
        description = self.optional_string(record, "description")
        lanes = self.integer(record, "lanes", minimum=1, maximum=L.LANES_MAX,
                             what="lanes of a ticket")
        page_tokens = self.integer(record, "page_tokens", minimum=1, maximum=L.PAGE_MAX_TOKENS,
                                   what="tokens of a page")
        pool_pages = self.integer(record, "pool_pages", minimum=1, maximum=L.POOL_MAX_PAGES,
                                  what="pages of a pool")
        kv = record["kv"]
        if not isinstance(kv, dict):
            raise self.fail("kv", f'must be an object like {{"dtype": "i8", "leading": 8, '
                                  f'"heads": 2}}, not {show(kv)}')
        self.check_keys(kv, _KV_KEYS, _KV_KEYS, "kv", prefix="kv.")
        dtype = self.string(kv, "dtype", prefix="kv.")
        if dtype not in KV_DTYPES:
            raise self.fail("kv.dtype", f"unknown dtype {echo(dtype)}; use one of "
                                        f"{', '.join(KV_DTYPES)}")
        leading = self.integer(kv, "leading", minimum=1, prefix="kv.",
                               maximum=L.PLANE_MAX_DIM, what="a plane's leading may be")
        heads = self.integer(kv, "heads", minimum=1, prefix="kv.", maximum=L.PLANE_MAX_DIM,
                             what="a plane's heads may be")
        source = self.optional_string(record, "source")
        self.header = TicketHeader(name, description, lanes, page_tokens, pool_pages, dtype,
                                   leading, heads, source)
        self.header_line = self.line
        self.check_world(self.header)

    def check_world(self, h: TicketHeader) -> None:
        """The replay's world (harness.run.workloads.pool_for: the pool, a table row per lane of as
        many entries as the pool has pages) within the limits."""
        geometry = KVPageGeometry((KVPlaneGeometry(DType.parse(h.dtype), h.leading, h.heads),),
                                  page_tokens=h.page_tokens)
        stride = geometry.page_stride
        if stride > L.PAGE_MAX_BYTES:
            raise self.fail("page_tokens", f"a page of {h.page_tokens} tokens of this kv takes "
                                           f"{stride:,} bytes, more than {L.PAGE_MAX_BYTES:,}, "
                                           "the most a page may; use fewer page_tokens")
        world = Footprint(h.pool_pages, stride, h.lanes, h.pool_pages)
        if world.fixed_bytes > L.WORLD_MAX_BYTES:
            raise self.fail("pool_pages", f"the replay's world takes {world.fixed_bytes:,} "
                                          f"bytes ({world.describe()}), more than "
                                          f"{L.WORLD_MAX_BYTES:,} (1 GiB), the most it may; use "
                                          "fewer pool_pages, fewer lanes or a smaller page")

    def read_request(self, record: dict[str, Any]) -> None:
        assert self.header is not None
        if len(self.requests) >= L.REQUESTS_MAX:
            raise self.fail("(record)", f"more than {L.REQUESTS_MAX:,} requests, the most a "
                                        "ticket may have; split the ticket")
        self.check_keys(record, _REQUEST_KEYS, _REQUEST_KEYS[1:-1], "request")
        request_id = self.integer(record, "id", minimum=0)
        if self.requests and request_id <= self.requests[-1].id:
            before = self.requests[-1]
            what = "repeats" if request_id == before.id else "goes back from"
            raise self.fail("id", f"{request_id} {what} id {before.id} on line "
                                  f"{self.request_lines[-1]}; ids must increase down the file")
        time_ms = _time(self, record)
        if self.requests and time_ms < self.requests[-1].time_ms:
            raise self.fail("time_ms", f"{time_ms} is before {self.requests[-1].time_ms} on line "
                                       f"{self.request_lines[-1]}; requests are in time order, "
                                       "so sort them by time_ms")
        lane = self.integer(record, "lane", minimum=0)
        if lane >= self.header.lanes:
            raise self.fail("lane", f"{lane} is out of range: the header declares "
                                    f"{self.header.lanes} lane(s), so use 0 to "
                                    f"{self.header.lanes - 1} or raise lanes")
        conversation = self.string(record, "conversation", limit=L.NAME_MAX_CHARS)
        if not conversation:
            raise self.fail("conversation", "must not be empty; name the conversation this "
                                            "request belongs to")
        turn = self.integer(record, "turn", minimum=1, maximum=L.REQUESTS_MAX,
                            what="turns (the most requests a ticket may have)")
        tokens: dict[str, int] = {}
        for name in _TOKEN_FIELDS:
            tokens[name] = self.integer(record, name, minimum=0, maximum=L.TOKENS_MAX,
                                        what="tokens of a request")
            # Relations as soon as their fields are read: a prefix longer than the prompt also
            # makes new_tokens negative, and the prefix is the mistake to point at.
            if name == "prefix_tokens" and tokens[name] > tokens["prompt_tokens"]:
                raise self.fail(name, f"{tokens[name]} exceeds prompt_tokens "
                                      f"{tokens['prompt_tokens']}; the cached prefix is part of "
                                      "the prompt")
            expected = tokens["prompt_tokens"] - tokens.get("prefix_tokens", 0)
            if name == "new_tokens" and tokens[name] != expected:
                raise self.fail(name, f"must be prompt_tokens - prefix_tokens = {expected}, "
                                      f"not {tokens[name]}")
        end = self.boolean(record, "end") if "end" in record else False
        if turn == 1 and not tokens["prompt_tokens"] + tokens["decode_tokens"]:
            # Its first request gives a conversation its pages; with none, the engine would
            # read an empty table row.
            raise self.fail("prompt_tokens", "a conversation's first request holds no token "
                                             "(prompt_tokens and decode_tokens are 0); give it "
                                             "a prompt")
        self.follow(conversation, lane, turn, end)
        self.requests.append(Request(request_id, time_ms, lane, conversation, turn, end=end,
                                     **tokens))
        self.request_lines.append(self.line)

    def follow(self, conversation: str, lane: int, turn: int, end: bool) -> None:
        """Check the request against its conversation so far, then record it."""
        known = self.conversations.get(conversation)
        if known is None:
            if turn != 1:
                raise self.fail("turn", f"conversation {conversation!r} starts here, so this is "
                                        f"turn 1, not {turn}; is an earlier request missing?")
        else:
            known_lane, last_turn, last_line, end_line = known
            if end_line:
                raise self.fail("conversation", f"{conversation!r} ended on line {end_line} "
                                                '("end": true) and cannot appear again; give a '
                                                "new conversation a new name")
            if lane != known_lane:
                raise self.fail("lane", f"conversation {conversation!r} runs on lane "
                                        f"{known_lane} (line {last_line}), not {lane}; a "
                                        "conversation keeps its lane")
            if turn != last_turn + 1:
                raise self.fail("turn", f"conversation {conversation!r} was at turn {last_turn} "
                                        f"on line {last_line}, so this is turn "
                                        f"{last_turn + 1}, not {turn}")
        self.conversations[conversation] = (lane, turn, self.line, self.line if end else 0)

    # -- the whole file --------------------------------------------------------------------

    def finish(self, text: str) -> Ticket:
        for record in self.records(text):
            self.record(record)
        if self.header is None:
            self.line = 1
            raise self.fail("(file)", "empty file; a ticket starts with a header line "
                                      f'{{"type": "header", "schema": "{TICKET_SCHEMA}", ...}}')
        ticket = Ticket(self.header, tuple(self.requests), self.path)
        self.check_pages(ticket)
        return ticket

    def check_pages(self, ticket: Ticket) -> None:
        """Replay the engine's batching plan on paper: the pages the live conversations hold
        must fit the pool at every engine step (kvcore refuses the materialize that would
        not), said at the request whose prefill would not fit."""
        pool = ticket.header.pool_pages
        held: dict[str, int] = {}
        total = 0
        for step in batching.plan(ticket):
            for work in step.work:
                conversation = work.request.conversation
                held[conversation] = held.get(conversation, 0) + work.new_pages
                total += work.new_pages
                if total > pool:
                    self.line = self.request_lines[work.number - 1]
                    others = total - held[conversation]
                    raise self.fail("prompt_tokens", (
                        f"conversation {echo(conversation)} would hold {held[conversation]} "
                        f"pages from this request on while the other live conversations hold "
                        f"{others}: {total} in all, more than the pool's {pool} (pool_pages); "
                        'raise pool_pages, or end conversations earlier ("end": true)'))
            for conversation in step.releases:
                total -= held.pop(conversation)


def _parse(path: Path, text: str) -> Ticket:
    return _Parser(path).finish(text)


def _time(parser: _Parser, record: dict[str, Any]) -> float:
    value = record["time_ms"]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise parser.fail("time_ms", f"must be a number of milliseconds, not {show(value)}")
    if value < 0:
        raise parser.fail("time_ms", f"must be 0 or more, not {value}")
    # An integer too big for a float (or an infinity) is no time a replay can wait for.
    if value > L.TIME_MAX_MS or not math.isfinite(value):
        raise parser.fail("time_ms", f"{value} is too large; use milliseconds since the "
                                     "ticket's start")
    return float(value)
