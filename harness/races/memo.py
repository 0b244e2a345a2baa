"""The race detector's memory of trials it analysed: a trial whose records have the shape of
one it analysed before gets that trial's findings, renumbered, without the analysis. On a GPU
the same ops repeat trial after trial. ``python -m harness.bench --detector`` shows what it saves
a run's worker (docs/testing.md has the figures).
"""

from __future__ import annotations

import copy
import dataclasses
import operator
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.races.findings import _OWNER_KINDS, Finding, OpRef, Owners
from kvcore.device import OpRecord
from kvcore.device.oplog import OpLog, Segment

_EVENT_KINDS = frozenset({"event_record", "event_wait", "sync_event", "event_query"})

_shape_of = operator.itemgetter(1, 2, 3, 4, 5, 6, 7, 8)
"""What the analysis reads of every record: stream, kind, reads, writes, records, waits, syncs
and step (not its number, its times, or its detail, read only of the kinds below)."""
_DETAIL_KINDS = _OWNER_KINDS | {"event_query"}


class _Side(NamedTuple):
    """How to move one op of a remembered finding to another trial of the same shape: its
    number, the rest of it, and where its record lies among the trial's entries (None: in a
    segment, so the rest stands as it is)."""

    seq: int
    rest: tuple[Any, ...]
    at: int | None


class _Kept(NamedTuple):
    """A remembered finding: its key, the finding itself (a copy: later records of its trial
    may count more of it), whether its missing edge in words holds for any trial (it names
    both ops by their steps, not by their numbers), and how to move each of its ops."""

    key: tuple[Any, ...]
    finding: Finding
    worded: bool
    first: _Side
    second: _Side


def _shape(entries: list[OpRecord | Segment]) -> tuple[list[Any], list[Any]]:
    """What the analysis of ``entries`` depends on, for comparison with a remembered trial's
    (this runs every trial). A record stands as what the analysis reads of it, and its detail
    for the kinds whose detail it reads; a segment as its templates (the same run of the same
    program gives the same tuple, compared by identity; the analysis reads no detail of the
    records whose value was live, memsets)."""
    if type(entries[0]) is not Segment and Segment not in map(type, entries):
        return (list(map(_shape_of, entries)),
                [r.detail for r in entries if r.kind in _DETAIL_KINDS])  # type: ignore
    shape: list[Any] = []
    details: list[Any] = []
    for e in entries:
        if type(e) is Segment:
            shape.append(e.templates)
        else:
            shape.append(_shape_of(e))
            if e.kind in _DETAIL_KINDS:  # type: ignore[union-attr]
                details.append(e.detail)  # type: ignore[union-attr]
    return shape, details


def _declarations(log: OpLog) -> tuple[Any, ...]:
    """Every buffer and stream an op log has declared, with the buffers' page strides: what an
    analysis knows of a device besides its records."""
    return (tuple(log.buffers.values()), tuple(log.streams.values()),
            tuple(log.page_bytes.items()))


def _span(entries: list[OpRecord | Segment]) -> tuple[int, int]:
    """The numbers of the first op of ``entries`` and of the one after the last (ops are
    numbered in order: they were numbered one after another when the span is their count)."""
    first, last = entries[0], entries[-1]
    lo = first.first_seq if type(first) is Segment else first.seq
    hi = (last.first_seq + len(last.templates) if type(last) is Segment  # type: ignore[union-attr]
          else last.seq + 1)  # type: ignore[union-attr]
    return lo, hi  # type: ignore[return-value]


def _places(entries: list[OpRecord | Segment]) -> list[int | None]:
    """Per op of ``entries``, the index of its record among them, or None for an op of a
    segment (whose detail is its template's, the same in every trial of the same shape)."""
    out: list[int | None] = []
    for k, e in enumerate(entries):
        if type(e) is Segment:
            out.extend([None] * len(e.templates))
        else:
            out.append(k)
    return out


@dataclass(slots=True)
class _Remembered:
    shape: tuple[list[Any], list[Any]]
    first_seq: int
    count: int  # ops
    findings: list[_Kept]
    racing: set[int]
    owners: tuple[Any, ...]  # who owned what when the trial began
    neutral: bool  # and owned it again when it ended
    run: tuple[int, ...] | None  # its pieces' identities, when it was segments alone
    # Its findings' JSON, and how to move each one's ops (see json_moved); False: it
    # cannot be moved as JSON (the words of its missing edge name ops by their numbers).
    json: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any], _Side, _Side]] | bool \
        | None = None

    def moved(self, shift: int, entries: list[OpRecord | Segment]
              ) -> dict[tuple[Any, ...], Finding]:
        """Its findings, by key, for a trial of its shape whose ops are numbered ``shift``
        on from its own, of ``entries``."""
        folded = {}
        for kept in self.findings:  # a loop: a comprehension costs a call
            a, b = kept.first, kept.second
            moved = folded[kept.key] = copy.copy(kept.finding)  # its words, when worded, too
            moved.first = OpRef(a.seq + shift, *a.rest) if a.at is None else \
                _moved_ref(a, entries)
            moved.second = OpRef(b.seq + shift, *b.rest) if b.at is None else \
                _moved_ref(b, entries)
        return folded

    def json_moved(self, shift: int, entries: list[OpRecord | Segment]
                   ) -> list[dict[str, Any]] | None:
        """Its findings' JSON for the trial of ``entries``, numbered ``shift`` on from its
        own, from its own JSON, made once (None where they must be built: see :attr:`json`):
        a worker sends every bad trial's findings, and a trial of the same shape has the same
        but for numbers (and, of an op that was a record, its Python line and scenario line)."""
        known = self.json
        if known is None:
            if all(kept.worded for kept in self.findings):
                known = self.json = [(j, j["first"], j["second"], k.first, k.second)
                                     for k, j in zip(self.findings, (
                                         f.to_json() for f in self.moved(0, entries).values()))]
            else:
                known = self.json = False
        if known is False:
            return None
        out = []
        for whole, first, second, a, b in known:  # type: ignore[union-attr]
            one = whole.copy()  # copies all the way down: no trial's JSON is another's
            one["first"] = _moved_json(first, a, shift, entries)
            one["second"] = _moved_json(second, b, shift, entries)
            out.append(one)
        return out


def _seq_moved(side: dict[str, Any], by: int) -> dict[str, Any]:
    """One side of a finding's JSON, its op numbered ``by`` on (a copy all the way down)."""
    return {**side, "seq": side["seq"] + by, "bytes": side["bytes"][:]}


_Moved = tuple[_Remembered, int, list[Any]]
"""A remembered trial's findings for another trial, not yet built: what it was, how far the
other's ops are numbered on from its own, the other's records."""


class Memo:
    """The last few trials' analyses, by the shape of their records. A trial of the same shape
    gets the same findings with its own op numbers: the analysis reads nothing else, but for
    the owners' names (compared when there are findings) and op numbers written into a note
    (such a trial is not remembered)."""

    SIZE = 8

    def __init__(self) -> None:
        self._kept: list[_Remembered] = []  # the most recent first
        # The kept trials that were segments alone, by their templates' identities (they hold
        # them): a reissued trial comes as the same pieces, cut where the host blocked.
        self._by_run: dict[tuple[int, ...], _Remembered] = {}
        self._last: _Remembered | None = None  # the last of them a trial was found to be
        self.hits = 0

    def find(self, entries: list[OpRecord | Segment], owners: Owners
             ) -> tuple[dict[tuple[Any, ...], Finding], tuple[set[int], int], bool] | None:
        """A remembered trial's findings for the trial of ``entries`` (by key, renumbered),
        its racing ops (and what moves their numbers to this trial's), and whether the trial
        leaves the owners as they were."""
        last = self._last  # most often the trial before: looked at first, with no key made
        if last is not None and _same_pieces(last.shape[0], entries):
            hit = self._hit(last, entries, owners)
            if hit is not None:
                return hit
        run = _run_key(entries)
        if run is not None:
            # A reissued trial: segments, whose templates are a kept trial's shape itself.
            kept = self._by_run.get(run)
            if kept is not None and _same_pieces(kept.shape[0], entries):
                hit = self._hit(kept, entries, owners)
                if hit is not None:
                    self._last = kept
                    return hit
        shape = _shape(entries)
        for kept in self._kept:
            if kept.shape == shape:
                hit = self._hit(kept, entries, owners)
                if hit is not None:
                    if kept is not self._kept[0]:  # the most recently used are kept longest
                        self._kept.remove(kept)
                        self._kept.insert(0, kept)
                    return hit
        return None

    def _hit(self, kept: _Remembered, entries: list[OpRecord | Segment], owners: Owners
             ) -> tuple[_Moved, tuple[set[int], int], bool] | None:
        """``kept``'s findings for the trial of ``entries``, of the same shape (as what moves
        them to it: built only when read), unless they would name other owners or the
        trial's ops are not numbered one after another."""
        same_owners = (kept.findings or kept.neutral) and kept.owners == owners.snapshot()
        if kept.findings and not same_owners:
            return None  # its findings would name other owners
        first, end = _span(entries)
        if end - first != kept.count:
            return None
        self.hits += 1
        shift = first - kept.first_seq
        # The ownership changes leave the owners as they were only from the same start.
        return (kept, shift, entries), (kept.racing, shift), bool(kept.neutral and same_owners)

    def keep(self, entries: list[OpRecord | Segment], records: list[OpRecord],
             findings: list[Finding], racing: set[int], owners: tuple[Any, ...],
             neutral: bool) -> None:
        """Remember the analysis of the trial of ``entries`` (``records`` expanded)."""
        first, end = _span(entries)
        count = len(records)
        if end - first != count or any(f.event_note for f in findings) and any(
                r.step is None for r in records if r.kind in _EVENT_KINDS):
            return  # a note may name an op by its number
        places = _places(entries)
        plans = [_kept(f, _side(f.first, first, places), _side(f.second, first, places))
                 for f in findings]
        run = _run_key(entries)
        kept = _Remembered(_shape(entries), first, count, plans, set(racing), owners, neutral,
                           run)
        self._kept.insert(0, kept)
        for old in self._kept[self.SIZE:]:
            if old.run is not None and self._by_run.get(old.run) is old:
                del self._by_run[old.run]
            if self._last is old:
                self._last = None
        del self._kept[self.SIZE:]
        if run is not None:
            self._by_run[run] = kept


def _run_key(entries: list[OpRecord | Segment]) -> tuple[int, ...] | None:
    """The identities of the templates of ``entries``, when they are all segments (else None):
    a memo's key that costs no look at the templates themselves."""
    run = []
    for e in entries:
        if type(e) is not Segment:
            return None
        run.append(id(e.templates))
    return tuple(run)


def _same_pieces(shape: list[Any], entries: list[OpRecord | Segment]) -> bool:
    """Whether a kept trial's shape is the templates of ``entries`` themselves, all segments
    (a record's first field is its number, never a piece; the key's identities could be
    another's, reused, only if the kept trial did not hold them)."""
    if len(shape) != len(entries):
        return False
    for piece, entry in zip(shape, entries):
        if piece is not entry[0]:
            return False
    return True


def _kept(finding: Finding, first: _Side, second: _Side) -> _Kept:
    """A finding remembered for later trials of the same shape: a fresh copy, with its
    missing edge in words worked out now when the words name both ops by their steps (its
    copies then carry them; else each copy works its own out, by its own numbers)."""
    fresh = dataclasses.replace(finding)
    worded = bool(finding.first.step and finding.second.step)
    if worded:
        fresh.missing  # noqa: B018 (worked out once, and kept by the copies)
    return _Kept(finding.key, fresh, worded, first, second)


def _side(ref: OpRef, first_seq: int, places: list[int | None]) -> _Side:
    """How to move ``ref``, of a trial whose first op was ``first_seq``."""
    return _Side(ref.seq, tuple(ref)[1:], places[ref.seq - first_seq])


def _moved_json(side: dict[str, Any], plan: _Side, shift: int,
                entries: list[OpRecord | Segment]) -> dict[str, Any]:
    """One side of a remembered finding's JSON, moved as :func:`_moved_ref` moves its op."""
    if plan.at is None:  # its JSON was made for the remembered trial: its number is plan.seq
        return _seq_moved(side, shift)
    record = entries[plan.at]
    detail = record.detail or {}  # type: ignore[union-attr]
    return {**side, "seq": record.seq, "site": detail.get("site"),
            "origin": detail.get("origin"), "bytes": side["bytes"][:]}


def _moved_ref(plan: _Side, entries: list[OpRecord | Segment]) -> OpRef:
    """An op of a remembered finding, at the place of a record of ``entries``."""
    rest = plan.rest
    record = entries[plan.at]  # type: ignore[index]
    detail = record.detail or {}  # type: ignore[union-attr]
    return OpRef(record.seq, rest[0], rest[1], rest[2], detail.get("site"), rest[4], rest[5],
                 rest[6], detail.get("origin"))

