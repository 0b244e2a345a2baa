"""What kind of gpurace document a file is, from its first lines.

Each document says what it is at its top: a JSON Lines file's first record names its schema
(``gpurace.ticket/1``, ``gpurace.trace/1``), a run document or an incident report its
``schema`` key, a capture file starts with ``["hello", ...]``, and a scenario or suite starts
with ``apiVersion: gpurace/v1`` and its ``kind``. A reader handed the wrong kind says which kind
it got and which command reads it, instead of its parser's words about a brace it did not
expect.
"""

from __future__ import annotations

import json
import re

_BY_SCHEMA = (
    ("gpurace.ticket/", "a ticket", "replay it with `gpurace replay FILE`"),
    ("gpurace.trace/", "an op trace", "check it with `gpurace check FILE`"),
    ("gpurace.run/", "a run document (run.json)",
     "merge shards with `gpurace merge`, or read its incidents with `gpurace report list`"),
    ("gpurace.report/", "an incident report", "read it with `gpurace report show FILE`"),
    ("gpurace.capture/", "a capture file of `gpurace watch`",
     "it is read by the watch that wrote it; check the run's trace.jsonl with `gpurace check`"),
)
_API = re.compile(r"^\s*apiVersion:\s*[\"']?gpurace/", re.M)
_KIND = re.compile(r"^\s*kind:\s*[\"']?(\w+)", re.M)
HEAD_CHARS = 4096
"""How much of a file is looked at: a document says what it is in its first line or lines."""


def document_kind(text: str) -> tuple[str, str] | None:
    """``(what it is, how to read it)`` for a gpurace document, or None for anything else."""
    head = text[:HEAD_CHARS]
    first = next((line.strip() for line in head.splitlines() if line.strip()), "")
    if first.startswith(("{", "[")):
        try:
            value = json.loads(first)
        except ValueError:
            try:  # a document written whole (run.json, report.json), not one record a line
                value = json.loads(text)
            except ValueError:
                return None
        if isinstance(value, list) and value[:1] == ["hello"]:
            return _BY_SCHEMA[-1][1:]
        schema = str(value.get("schema", "")) if isinstance(value, dict) else ""
        for prefix, what, how in _BY_SCHEMA:
            if schema.startswith(prefix):
                return what, how
        return None
    if _API.search(head):
        kind = _KIND.search(head)
        if kind is not None and kind.group(1) == "Suite":
            return "a suite", "run it with `gpurace run FILE`"
        return "a scenario", "run it with `gpurace run FILE`"
    return None


def wrong_kind(text: str, expected: str) -> str | None:
    """The words for a file that is another gpurace document than ``expected`` ("a ticket"),
    or None when it is not a gpurace document at all (its reader's own message fits then)."""
    kind = document_kind(text)
    if kind is None or kind[0] == expected:
        return None
    return f"this is {kind[0]}, not {expected}: {kind[1]}"
