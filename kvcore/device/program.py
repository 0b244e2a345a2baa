"""Programs: the device calls of one piece of host work, captured once and issued again.

An engine that runs the same step loop many times does not re-derive its launches every time:
CUDA graphs capture a stream's work once and launch it again. A :class:`Program` does that for
the host's side: :meth:`Device.capture` records, in order, every backend action (copy, memset,
launch, event record and wait, synchronize, host store, graph launch) that the code inside it
made, with the op-log record each one wrote; :meth:`Device.reissue` makes the same calls again,
and hands the observers the same records (numbered and stamped anew), without running the code
that decided them. What depends on state the capture cannot see (a generation number that grows, a
comparison's result) is captured as a call of its own with :meth:`Device.reissued`, and runs
again in full; a value that changes every time but goes into the same action (the next
generations a host store copies, a scrub's byte) is given live (``host_write(live=True)``,
a :class:`Live` byte), so the action stays captured and takes the value of the moment.

Observers that take segments (``OpLog.subscribe(..., segments=...)``) get a reissued run's
records unbuilt, in one :class:`kvcore.device.oplog.Segment`: numbering them is all the
reissue does for the op log. A race detector that has analysed the same run before needs no
more.

A program is only as good as the state it was captured in: issuing it again is right when the
state its code read is the same. The caller checks that (kvcore's pool and arena have
``state_key``); what the device sees that the capture cannot (an event query, whose answer
depends on timing; an allocation, which changes the state) leaves the program with a reason in
:attr:`Program.refused`, and it must not be issued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvcore.device.oplog import Template

ACTION, RECORD, CALL = 0, 1, 2
"""What an item of a program is: a backend action (with the record it wrote, if any), a record
that no action wrote (an owner change), or a call captured as itself."""

BLOCKING = frozenset({"_do_sync_device", "_do_sync_stream", "_do_sync_event"})
"""The actions the host waits in: the op log's blocking hooks run before each, as they do when
the code runs."""


class Live:
    """A value its owner keeps current, given to an action in place of the value itself: a
    program issuing the action again takes what it holds then (a scrub's byte, another every
    trial), and so does the action's record (its ``detail.value``)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


class Where(NamedTuple):
    """The op log's step, origin and thread when an item was captured."""

    step: str | None = None
    origin: str | None = None
    thread: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Item:
    """One entry of a program. ``name`` is the device method an action called (what a backend
    lowers it by), ``fn`` that method and ``args`` what it was given (as the program keeps
    them); ``template`` the record it wrote, if any."""

    kind: int  # ACTION, RECORD or CALL
    name: str
    fn: Callable[..., Any] | None
    args: tuple[Any, ...]
    template: Template | None = None
    where: Where = Where()


class Lowered(NamedTuple):
    """An item as a backend issues it again (see ``Device._lower``): the call it makes (None:
    nothing to call, only its record) with its arguments, the item's kind, whether the host
    blocks in it, and the record it writes."""

    fn: Callable[..., Any] | None
    args: tuple[Any, ...]
    kind: int
    blocking: bool
    template: Template | None


class Issue(NamedTuple):
    """A call of a reissued item: ``fn(*args)``, for item ``index`` (named when it raises)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    index: int


BLOCKS, CALLS = 1, 2
"""What sets a run's item apart (see :class:`Run`): the host blocks in it (when the op log has
blocking hooks), or it is a call captured as itself."""


class Apart(NamedTuple):
    """An item a run sets apart: its call, ``how`` (BLOCKS or CALLS), how many templates come
    ``before`` it (a call's records, if it writes any, come after those), and its item's
    ``where``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    index: int
    how: int
    before: int
    where: Where


class Chunk(NamedTuple):
    """Calls a run makes one after another (``plain``), then the item set apart after them
    (None at the run's end)."""

    plain: list[Issue]
    apart: Apart | None


@dataclass(eq=False)
class Run:
    """Items of a program as issued to observers that take segments (see
    ``kvcore.device.oplog.Segment``): the templates of the records they write, which of them
    take a :class:`Live` value (their positions), and what to call, in ``chunks``.
    ``before``: by item index, how many templates come before the item."""

    templates: tuple[Template, ...]
    live: tuple[int, ...]
    chunks: list[Chunk]
    before: dict[int, int]
    _pieces: dict[tuple[int, int], tuple[Template, ...]] = field(default_factory=dict)
    _cuts: dict[tuple[int, int], tuple[tuple[Template, ...], int]] = field(default_factory=dict)

    def piece(self, start: int, stop: int) -> tuple[Template, ...]:
        """Templates ``start`` to ``stop``: the same tuple each time, so that observers can
        know a piece of a run they saw before by its identity, as they know a whole run."""
        if not start and stop == len(self.templates):
            return self.templates
        got = self._pieces.get((start, stop))
        if got is None:
            got = self._pieces[start, stop] = self.templates[start:stop]
        return got

    def cut(self, start: int, stop: int) -> tuple[tuple[Template, ...], int]:
        """:meth:`piece` ``start`` to ``stop``, and how many of its templates take a
        :class:`Live` value: a reissued run is cut at the same places every time it runs."""
        got = self._cuts.get((start, stop))
        if got is None:
            got = self._cuts[start, stop] = (self.piece(start, stop),
                                             sum(start <= k < stop for k in self.live))
        return got


@dataclass(eq=False)
class Program:
    """What :meth:`Device.capture` recorded. ``observed``: the op log had observers while it
    was captured, so its items carry their records (a program is issued again only with the
    op log in the same state). ``marks``: positions the capturing code named (:meth:`mark`)."""

    observed: bool
    items: list[Item] = field(default_factory=list)
    refused: str | None = None
    marks: dict[str, int] = field(default_factory=dict)
    # Per item, once lowered (see Device.capture): what Device.reissue reads.
    calls: list[Lowered] = field(default_factory=list)
    failed_at: int | None = None  # the item that raised, in the last issue that raised
    # Per (start, stop): only the items that call something: what Device.reissue runs when
    # nobody reads the op log.
    _bare: dict[tuple[int, int], list[Issue]] = field(default_factory=dict)
    _runs: dict[tuple[int, int, bool], Run] = field(default_factory=dict)

    def bare(self, start: int, stop: int) -> list[Issue]:
        """The calls of items ``start`` to ``stop`` (see ``_bare``)."""
        got = self._bare.get((start, stop))
        if got is None:
            got = self._bare[start, stop] = [Issue(call.fn, call.args, i) for i, call in
                                             enumerate(self.calls[start:stop], start)
                                             if call.fn is not None]
        return got

    def run(self, start: int, stop: int, hooks: bool) -> Run:
        """Items ``start`` to ``stop`` as one :class:`Run`; ``hooks``: the op log has blocking
        hooks (the actions the host blocks in are set apart)."""
        got = self._runs.get((start, stop, hooks))
        if got is None:
            got = self._runs[start, stop, hooks] = self._run(start, stop, hooks)
        return got

    def _run(self, start: int, stop: int, hooks: bool) -> Run:
        templates: list[Template] = []
        chunks: list[Chunk] = []
        plain: list[Issue] = []
        before: dict[int, int] = {}
        for i in range(start, stop):
            fn, args, kind, blocking, template = self.calls[i]
            before[i] = len(templates)
            if kind == CALL or fn is not None and hooks and blocking:
                how = CALLS if kind == CALL else BLOCKS
                assert fn is not None  # a call captured as itself has its function
                chunks.append(Chunk(plain, Apart(fn, args, i, how, before[i],
                                                 self.items[i].where)))
                plain = []
            elif fn is not None:
                plain.append(Issue(fn, args, i))
            if template is not None:
                templates.append(template)
        chunks.append(Chunk(plain, None))
        live = tuple(k for k, t in enumerate(templates) if t.live is not None)
        return Run(tuple(templates), live, chunks, before)

    def mark(self, name: str) -> None:
        """Name the position of the next item (``issue(program, program.marks[name])``)."""
        self.marks[name] = len(self.items)

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why

    def step_at(self, index: int) -> str | None:
        """The op log's step when item ``index`` was captured."""
        return self.items[index].where.step if 0 <= index < len(self.items) else None
