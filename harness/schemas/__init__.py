"""JSON Schemas (draft 2020-12) of every document gpurace writes or reads, shipped as package data.

=================  ==========================================================================
name               the document
=================  ==========================================================================
``run``            run.json, ``gpurace run --format json`` (``gpurace.run/1``)
``report``         an incident's report.json (``gpurace.report/1``)
``trace-record``   one line of an op trace (``gpurace.trace/1``)
``ticket-record``  one line of a ticket (``gpurace.ticket/1``)
``list``           ``gpurace list --format json`` (``gpurace.list/1``)
``check``          ``gpurace check --format json`` (``gpurace.check/1``)
``explore``        ``gpurace explore --format json`` (``gpurace.explore/1``)
``scenario``       a scenario or suite YAML file, for editors (yaml-language-server)
=================  ==========================================================================

Each is the file ``NAME.schema.json`` beside this module, made by :mod:`harness.tools.schemas`
from the code that writes and reads the document (``python -m harness.tools.schemas`` remakes
them; a test checks they are up to date). Reading one imports nothing else of gpurace.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

SUFFIX = ".schema.json"


def names() -> list[str]:
    """The names of the schemas gpurace ships, sorted."""
    return sorted(entry.name.removesuffix(SUFFIX)
                  for entry in resources.files(__name__).iterdir()
                  if entry.name.endswith(SUFFIX))


def text(name: str) -> str:
    """The schema ``name`` as its file holds it (JSON text)."""
    if name not in names():
        raise KeyError(f"no schema {name!r}; gpurace has {', '.join(names())}")
    return resources.files(__name__).joinpath(name + SUFFIX).read_text(encoding="utf-8")


def load(name: str) -> dict[str, Any]:
    """The schema ``name`` (see :func:`names`) as a dict; KeyError for an unknown name."""
    schema: dict[str, Any] = json.loads(text(name))
    return schema
