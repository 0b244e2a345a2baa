"""Where a JSON Lines error must point, worked out from the file independently of the reader:
the tests of tickets and op traces check each message's ``file:line:col:`` exactly with it."""

from __future__ import annotations

import json
from pathlib import Path


def line_of(path: Path, line: int) -> str:
    """Line ``line`` (1-based) of ``path`` as text, or "" when there is none."""
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    except OSError:
        return ""
    return lines[line - 1] if 0 < line <= len(lines) else ""


def column(text: str, field: str) -> int:
    """The column an error about ``field`` on the line ``text`` names: json's own column for a
    line it cannot read, the column of the field's key (the innermost of ``kv.dtype``, found
    after the outer one; ``reads`` for ``reads[0]``), 1 for a key that is not there and for the
    record or the file as a whole."""
    if field == "(record)":
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            return exc.colno
        return 1
    if field.startswith("("):
        return 1
    at = -1
    for key in field.split("."):
        found = text.find(f'"{key.split("[")[0]}":', max(at, 0))
        if found < 0:
            break
        at = found
    return at + 1 if at >= 0 else 1


def prefix(path: Path, line: int, field: str) -> str:
    """How the error about ``field`` on ``line`` of ``path`` starts."""
    return f"{path}:{line}:{column(line_of(path, line), field)}: {field}: "
