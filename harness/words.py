"""How a count reads in a message: "1 trial", "3 trials". Every command and the runner say
counts through :func:`counted`, so that none says "1 trials" again."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, the noun plural unless the count is exactly one (``0 trials``,
    ``1 trial``, ``2 trials``); ``plural`` for a noun that does not take an ``s``."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
