"""Strict JSON Lines reading, shared by the two trace levels (tickets and op traces).

A trace is edited by hand, cut by a killed writer, or made by another version of gpurace; each of
those must come back as one error naming the file, the line, the column and the field, with what
to change (``file:line:col: field: message``; the column is where the field's key starts on the
line, or 1 for the record as a whole). :class:`LineParser` holds where the reader is and the
field checks, bounded by :mod:`harness.limits`; the readers subclass it and check their own
records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from harness.errors import TraceError
from harness.inputs import Unreadable, clip, plain, read_input, utf8_error_at
from harness.limits import COUNT_MAX, ECHO_MAX_CHARS, JSON_MAX_DEPTH, TEXT_MAX_CHARS
from harness.traces.kinds import wrong_kind


def read_text(path: Path, what: str, limit: int,
              remedy: str = "split it or make it smaller") -> str:
    """The UTF-8 text of ``path``, at most ``limit`` bytes; ``what`` names the format in the
    error ("a ticket"), ``remedy`` what to do about one too large."""
    try:
        data = read_input(path, limit, what, remedy=remedy)
    except Unreadable as exc:
        raise line_error(path, 1, 1, "(file)", str(exc)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = utf8_error_at(data, exc.start)
        raise line_error(path, line, column, "(record)",
                         f"not UTF-8 text (byte {data[exc.start]:#04x}); {what} is UTF-8 JSON "
                         "Lines") from None


def line_error(path: Path, line: int, column: int, field_name: str,
               message: str) -> TraceError:
    return TraceError(f"{path}:{line}:{column}: {field_name}: {message}")


def column_of(raw: str, field_name: str) -> int:
    """Where ``field_name`` (``kv.dtype``, ``reads[2]``) starts on the line ``raw``: the column
    of its innermost key found, 1 when none is (a missing key, the record as a whole)."""
    at = -1
    for name in re.split(r"\.|\[\d+\]", field_name):
        if not name or name.startswith("("):
            continue
        found = -1
        for key in {json.dumps(name), json.dumps(name, ensure_ascii=False)}:
            match = re.compile(re.escape(key) + r"\s*:").search(raw, max(at, 0))
            if match and (found < 0 or match.start() < found):
                found = match.start()
        if found < 0:
            break
        at = found
    return at + 1 if at >= 0 else 1


class LineParser:
    """Where a reader is in a JSON Lines file, and the checks its records share. ``fail``
    builds the error for the current line; subclasses raise it."""

    remedy = "fix this line"
    """What to do about a line that is not one whole JSON object."""
    reads = "a JSON Lines file"
    """What it reads, as :func:`~harness.traces.kinds.wrong_kind` names documents."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.line = 0
        self.lines: list[str] = []  # a whole text's lines (none for a stream)
        self.raw = ""  # the line being read

    def fail(self, field_name: str, message: str, column: int | None = None) -> TraceError:
        # The error's column is found on its line: any line of a whole text (a check may
        # point back at an earlier one), the one being read of a stream.
        raw = self.lines[self.line - 1] if 0 < self.line <= len(self.lines) else self.raw
        field_name = clip(plain(field_name))  # a key is the file's text
        return line_error(self.path, self.line, column or column_of(raw, field_name),
                          field_name, message)

    def records(self, text: str) -> Iterator[Any]:
        """Each line's JSON value, with :attr:`line` set to its number; blank lines skipped."""
        self.lines = lines = text.split("\n")
        for number, raw in enumerate(lines, 1):
            torn = number == len(lines) and not text.endswith("\n")
            record = self.parse(number, raw, torn, text if number == 1 else "")
            if record is not None:
                yield record

    def read_lines(self, file: Iterable[str]) -> Iterator[Any]:
        """:meth:`records` of a file read a line at a time (a line is held, never the file)."""
        for number, raw in enumerate(file, 1):
            record = self.parse(number, raw.removesuffix("\n"), not raw.endswith("\n"),
                                raw if number == 1 else "")
            if record is not None:
                yield record

    def parse(self, number: int, raw: str, torn: bool, head: str) -> Any:
        """Line ``number``'s JSON value (None for a blank line); ``torn``: the file ends
        without its newline; ``head``: the file's text, for line 1's "what is this file"."""
        self.line, self.raw = number, raw
        line = raw.removesuffix("\r")
        if not line.strip():
            return None  # blank lines (a trailing newline, an editor's extra one) carry nothing
        deep = _too_deep(line)
        if deep is not None:
            # Said before json reads it: how deep json can go depends on the Python version
            # (3.11 gives up with RecursionError, 3.13 reads on), the answer must not.
            raise self.fail("(record)", f"nested too deep to read (arrays or objects "
                                        f"inside each other, more than {JSON_MAX_DEPTH}); "
                                        f"{self.remedy}", deep)
        try:
            record = json.loads(line, object_pairs_hook=_no_duplicates,
                                parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            wrong = wrong_kind(head, self.reads) if head else None
            if wrong is not None:
                raise self.fail("(file)", wrong, 1) from None
            why = "the file ends mid-record; " if torn else ""
            # json says "Unterminated string starting at": the column follows once.
            said = exc.msg.removesuffix(" at")
            raise self.fail("(record)", f"truncated or not JSON ({why}{said} at column "
                                        f"{exc.colno}); each line must be one whole JSON "
                                        f"object: {self.remedy}", exc.colno) from None
        except _DuplicateKey as exc:
            raise self.fail(str(exc), "appears twice in this record; keep one") from None
        except _NotANumber as exc:
            raise self.fail("(record)", f"{exc} is not a JSON number; use a finite "
                                        "number") from None
        except RecursionError:
            raise self.fail("(record)", "nested too deep to read (arrays or objects "
                                        f"inside each other); {self.remedy}") from None
        except ValueError:
            # Python reads no integer of more than 4,300 digits; none fits a field anyway.
            digits = re.search(r"\d{4300,}", line)
            raise self.fail("(record)", "a number of more than 4,300 digits; no field "
                                        "takes one: fix this line",
                            (digits.start() + 1) if digits else 1) from None
        if not isinstance(record, dict):
            raise self.fail("(record)", f"a record must be a JSON object, not "
                                        f"{json_kind(record)}; write one {{...}} per line")
        return record

    def check_keys(self, record: dict[str, Any], allowed: Sequence[str],
                   required: Sequence[str], what: str, prefix: str = "") -> None:
        # Unknown keys first: a misspelt key would otherwise be reported as the right key
        # missing, which hides the typo.
        for key in record:
            if key not in allowed:
                close = get_close_matches(key, allowed, n=1)
                hint = f"did you mean {close[0]!r}?" if close else \
                    f"a {what} has {', '.join(allowed)}"
                raise self.fail(f"{prefix}{key}", f"unknown key; {hint}")
        for key in required:
            if key not in record:
                raise self.fail(f"{prefix}{key}", f"missing; a {what} needs "
                                                  f"{', '.join(required)}")

    def integer(self, record: dict[str, Any], key: str, minimum: int, prefix: str = "",
                maximum: int = COUNT_MAX, what: str = "") -> int:
        """An integer from ``minimum`` to ``maximum`` (a limit of harness.limits; ``what``
        says what it bounds)."""
        value = record[key]
        # bool is an int to Python, but `true` in a count is a mistake, not a 1.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(f"{prefix}{key}", f"must be an integer, not {show(value)}")
        if value < minimum:
            raise self.fail(f"{prefix}{key}", f"must be {minimum} or more, not {show(value)}")
        if value > maximum:
            bound = f", the most {what}" if what else ""
            raise self.fail(f"{prefix}{key}", f"{show(value)} is more than {maximum}{bound}; "
                                              "use a smaller value")
        return value

    def string(self, record: dict[str, Any], key: str, prefix: str = "",
               limit: int = TEXT_MAX_CHARS) -> str:
        value = record[key]
        if not isinstance(value, str):
            raise self.fail(f"{prefix}{key}", f"must be a string, not {show(value)}")
        if len(value) > limit:
            raise self.fail(f"{prefix}{key}", f"a string of {len(value):,} characters; at most "
                                              f"{limit}: shorten it")
        return value

    def boolean(self, record: dict[str, Any], key: str) -> bool:
        value = record[key]
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, not {show(value)}")
        return value

    def optional_string(self, record: dict[str, Any], key: str) -> str | None:
        if key not in record:
            return None
        return self.string(record, key)


class _DuplicateKey(Exception):
    pass


class _NotANumber(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal keys; in a hand-edited trace that silently drops
    # the value the author meant, so refuse it.
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise _DuplicateKey(key)
        record[key] = value
    return record


def _no_constant(name: str) -> Any:
    # NaN and Infinity are not JSON, though Python's json accepts them.
    raise _NotANumber(name)


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def show(value: Any) -> str:
    """A value as it appears in the file (at most ECHO_MAX_CHARS of it), and what kind of JSON
    value it is."""
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):  # an integer too long to write, a deep structure
        text = "…"
    return f"{clip(text, ECHO_MAX_CHARS)} ({json_kind(value)})"


_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')
"""JSON strings (skipped whole) and brackets: what nesting depth is counted from."""


def _too_deep(line: str) -> int | None:
    """The column where ``line`` nests deeper than JSON_MAX_DEPTH, or None. Cheap for the
    common line: it counts brackets only when there are enough of them to matter."""
    if line.count("[") + line.count("{") <= JSON_MAX_DEPTH:
        return None
    depth = 0
    for match in _STRUCTURE.finditer(line):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > JSON_MAX_DEPTH:
                return match.start() + 1
        elif token in "]}":
            depth -= 1
    return None
