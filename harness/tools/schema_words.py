"""The words gpurace's JSON Schemas (draft 2020-12) are written in: a bounded integer, a closed
object, a nullable value, a document with its definitions. :mod:`harness.tools.schemas` and
:mod:`harness.tools.scenario_schema` build every schema from these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from harness import limits as L

Schema = dict[str, Any]

DRAFT = "https://json-schema.org/draft/2020-12/schema"

NAME_REGEX = "^[a-z0-9][a-z0-9_-]*$"
"""harness.lang.yamlnodes.NAME_PATTERN and harness.traces.ticket.NAME_PATTERN, matched whole."""


def integer(minimum: int | None = None, maximum: int | None = None, **more: Any) -> Schema:
    return _bounded("integer", minimum, maximum, more)


def number(minimum: float | None = None, maximum: float | None = None, **more: Any) -> Schema:
    return _bounded("number", minimum, maximum, more)


def _bounded(kind: str, minimum: float | None, maximum: float | None,
             more: dict[str, Any]) -> Schema:
    """A JSON number type with the bounds given (keys in the order the schemas have them)."""
    schema: Schema = {"type": kind}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return {**schema, **more}


def string(max_length: int | None = None, **more: Any) -> Schema:
    schema: Schema = {"type": "string"}
    if max_length is not None:
        schema["maxLength"] = max_length
    return {**schema, **more}


BOOLEAN: Schema = {"type": "boolean"}
NULL: Schema = {"type": "null"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, NULL]}


def array(items: Schema, min_items: int | None = None, max_items: int | None = None,
          **more: Any) -> Schema:
    schema: Schema = {"type": "array", "items": items}
    if min_items is not None:
        schema["minItems"] = min_items
    if max_items is not None:
        schema["maxItems"] = max_items
    return {**schema, **more}


def enum(values: Iterable[Any], **more: Any) -> Schema:
    return {"enum": list(values), **more}


def const(value: Any, **more: Any) -> Schema:
    return {"const": value, **more}


def ref(name: str) -> Schema:
    return {"$ref": f"#/$defs/{name}"}


def closed(properties: dict[str, Schema], required: Sequence[str] | None = None,
           **more: Any) -> Schema:
    """An object of exactly these keys; all of them required unless ``required`` says which."""
    return {"type": "object", "properties": properties,
            "required": list(properties if required is None else required),
            "additionalProperties": False, **more}


def document(title: str, description: str, body: Schema, defs: dict[str, Schema]) -> Schema:
    schema: Schema = {"$schema": DRAFT, "title": title, "description": description, **body}
    if defs:
        schema["$defs"] = defs
    return schema


def described(schema: Schema, text: str) -> Schema:
    return {"description": text, **schema}


NAME = string(L.NAME_MAX_CHARS, minLength=1, pattern=NAME_REGEX)
TEXT = string(L.TEXT_MAX_CHARS)
SECONDS = number(0)
SPAN = {"type": "array", "prefixItems": [integer(0, L.COUNT_MAX), integer(0, L.COUNT_MAX),
                                          integer(0, L.COUNT_MAX)],
        "items": False, "minItems": 3,
        "description": "[buffer, offset, length]: bytes of a buffer declared above"}
