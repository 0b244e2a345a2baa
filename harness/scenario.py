"""Load scenario and suite files (YAML) into the frozen records of :mod:`harness.model`.

The loader is strict: an unknown key, a wrong type, a duplicate key or a reference to a stream,
lease, catalog, buffer, event or step that does not exist (yet) is a
:class:`~harness.errors.ScenarioError` whose message starts ``file:line:col: path:``, pointing
at the YAML node to fix. It walks PyYAML's node tree rather than the constructed Python objects
because only nodes remember where they were written.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

import kvcore
from harness.errors import ScenarioError
from harness.model import (
    EXPECTATIONS,
    STEP_OPS,
    STREAMS,
    WORKLOAD_PHASES,
    Amplify,
    Location,
    PlaneSpec,
    PoolSpec,
    Scenario,
    Step,
    Suite,
    Variant,
    Workload,
)

__all__ = [
    "API_VERSION", "KINDS", "NAME_PATTERN", "WORKLOAD_KINDS", "WORKLOAD_PHASES", "arg_kind",
    "load_document", "load_scenario", "load_suite",
]

API_VERSION = "gpurace/v1"
KINDS = ("Scenario", "Suite")
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]*")
"""Scenario, suite, variant, step, buffer and event names (matched whole)."""
WORKLOAD_KINDS = ("conversation", "ticket")
DTYPES = tuple(d.label for d in kvcore.DType)

ROOT = "(document)"
TOP_KEYS = ("apiVersion", "kind", "metadata", "spec")

# What each step argument is. A key's kind is looked up as (op, key) first, then key alone,
# because src/dst/buffer/event mean different things for different ops.
_ARG_KINDS: dict[tuple[str, str] | str, str] = {
    "stream": "stream",
    "pages": "count",
    "byte": "byte",
    "us": "duration",
    "assert": "bool",
    "lease": "lease",
    "catalog": "catalog",
    ("host_fill", "buffer"): "name",
    ("check", "buffer"): "buffer",
    ("check", "equals"): "buffer",
    ("copy_from_host", "src"): "buffer",
    ("copy_from_host", "dst"): "lease",
    ("copy_to_host", "src"): "lease",
    ("copy_to_host", "dst"): "name",
    ("copy_page", "src"): "lease",
    ("copy_page", "dst"): "lease",
    ("record_event", "event"): "name",
    ("wait_event", "event"): "event",
}

# Steps that introduce a name later steps may refer to: (op, key) -> what the name is.
_DEFINES: dict[tuple[str, str], str] = {
    ("materialize", "id"): "lease",
    ("catalog", "id"): "catalog",
    ("host_fill", "buffer"): "buffer",
    ("copy_to_host", "dst"): "buffer",
    ("record_event", "event"): "event",
}

_HOW_TO_DEFINE = {
    "lease": "a materialize step with an id defines one",
    "catalog": "a catalog step with an id defines one",
    "buffer": "a host_fill or copy_to_host step defines one",
    "event": "a record_event step records one",
}

# A check reads one thing and compares it with one thing; keys and what they mean to the user.
_CHECK_CHOICES = (
    (("lease", "buffer"), "lease (device pages) or buffer (a host buffer), to read"),
    (("equals", "byte"), "equals (a host buffer) or byte (0-255), to compare with"),
)


def arg_kind(op: str, key: str) -> str:
    """What the argument ``key`` of a step ``op`` holds (``stream``, ``lease``, ``count``...)."""
    return _ARG_KINDS.get((op, key)) or _ARG_KINDS[key]


# --------------------------------------------------------------------------------------------
# Public entry points


def load_scenario(path: str | Path) -> Scenario:
    """Read and check the scenario file ``path``; raise ScenarioError on anything wrong."""
    reader, root = _open(path)
    kind, top = _header(reader, root)
    _expect_kind(reader, top, kind, "Scenario")
    return _scenario(reader, top, Path(path))


def load_suite(path: str | Path) -> Suite:
    """Read and check the suite file ``path``; its scenario paths must exist (they are not
    loaded here)."""
    reader, root = _open(path)
    kind, top = _header(reader, root)
    _expect_kind(reader, top, kind, "Suite")
    return _suite(reader, top, Path(path))


def load_document(path: str | Path) -> Scenario | Suite:
    """Read a scenario or a suite file, whichever its ``kind`` says it is."""
    reader, root = _open(path)
    kind, top = _header(reader, root)
    if kind == "Suite":
        return _suite(reader, top, Path(path))
    return _scenario(reader, top, Path(path))


# --------------------------------------------------------------------------------------------
# Reading nodes


@dataclass
class _Fields:
    """A YAML mapping whose keys are known to be unique strings, in document order."""

    node: MappingNode
    path: str
    keys: dict[str, Node]
    values: dict[str, Node]

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def sub(self, key: str) -> str:
        return _sub(self.path, key)


def _sub(path: str, key: str) -> str:
    return key if path == ROOT else f"{path}.{key}"


def _suggest(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _short_tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


def _describe(value: object, node: Node) -> str:
    """How a value reads in an error message: YAML's words, not Python's."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, (int, float)):
        return f"{value!r}"
    return f"a {type(value).__name__} ({node.value!r})"


class _Reader:
    """Turns nodes of one file into checked Python values, or ScenarioErrors that point at
    them."""

    def __init__(self, file: str) -> None:
        self.file = file
        # Only its constructor is used: scalars resolve (0xAB, true, 1e3) exactly as YAML says.
        self._loader = yaml.SafeLoader("")

    def where(self, node: Node, path: str) -> Location:
        mark = node.start_mark
        return Location(self.file, mark.line + 1, mark.column + 1, path)

    def error(self, node: Node, path: str, message: str) -> ScenarioError:
        return ScenarioError(self.where(node, path), message)

    def value(self, node: Node, path: str) -> object:
        """The Python value of a scalar node; mappings and lists come back as their node."""
        if not isinstance(node, ScalarNode):
            return node
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError:
            raise self.error(node, path,
                             f"unsupported tag {_short_tag(node.tag)}; remove it") from None
        except (ValueError, TypeError):
            # An explicit tag the text does not fit: !!int abc.
            raise self.error(node, path, f"{node.value!r} cannot be read as "
                             f"{_short_tag(node.tag)}; remove the tag or fix the value") from None

    def mismatch(self, node: Node, path: str, expected: str, value: object) -> ScenarioError:
        return self.error(node, path, f"expected {expected}, got {_describe(value, node)}")

    def fields(self, node: Node, path: str, expected: str) -> _Fields:
        """Check that ``node`` is a mapping with unique scalar keys."""
        if not isinstance(node, MappingNode):
            raise self.mismatch(node, path, expected, self.value(node, path))
        self.plain_tag(node, path, "tag:yaml.org,2002:map")
        keys: dict[str, Node] = {}
        values: dict[str, Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                raise self.error(key_node, path, "a key must be a plain name, not a list or "
                                 "a mapping")
            # Keys are names, so they are read as written: a variant called `on` or `1` stays
            # a string instead of turning into a boolean or an integer.
            key = key_node.value
            key_path = _sub(path, key)
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise self.error(key_node, key_path, "merge keys (<<) are not supported; "
                                 "write the keys out")
            if key in keys:
                first = keys[key].start_mark
                raise self.error(key_node, key_path,
                                 f"duplicate key {key!r} (first at line {first.line + 1}, "
                                 f"column {first.column + 1}); keep one")
            keys[key] = key_node
            values[key] = value_node
        return _Fields(node, path, keys, values)

    def plain_tag(self, node: Node, path: str, tag: str) -> None:
        """Reject tagged collections (!!set, !!omap, !foo): they mean something else."""
        if node.tag != tag:
            raise self.error(node, path, f"unsupported tag {_short_tag(node.tag)}; remove it")

    def allow(self, fields: _Fields, allowed: Sequence[str], context: str = "") -> None:
        """Reject keys not in ``allowed``, at the first such key."""
        for key, key_node in fields.keys.items():
            if key not in allowed:
                raise self.error(key_node, fields.sub(key),
                                 f"unknown key {key!r}{context}{_suggest(key, allowed)}; "
                                 f"allowed keys: {', '.join(allowed)}")

    def require(self, fields: _Fields, required: Sequence[str], what: str) -> None:
        for key in required:
            if key not in fields:
                raise self.error(fields.node, fields.path,
                                 f"{what} is missing the required key {key!r}; add it")

    def mapping(self, node: Node, path: str, allowed: Sequence[str],
                required: Sequence[str] = (), what: str = "") -> _Fields:
        """A mapping with only ``allowed`` keys and every ``required`` one."""
        what = what or path
        fields = self.fields(node, path, f"a mapping with keys {', '.join(allowed)}")
        self.allow(fields, allowed)
        self.require(fields, required, what)
        return fields

    def sequence(self, node: Node, path: str, expected: str,
                 nonempty: bool = True) -> list[Node]:
        if not isinstance(node, SequenceNode):
            raise self.mismatch(node, path, expected, self.value(node, path))
        self.plain_tag(node, path, "tag:yaml.org,2002:seq")
        if nonempty and not node.value:
            raise self.error(node, path, f"expected {expected}, got an empty list")
        return list(node.value)

    def string(self, node: Node, path: str) -> str:
        value = self.value(node, path)
        if not isinstance(value, str):
            hint = ""
            if isinstance(node, ScalarNode) and node.style is None and value is not None:
                hint = f" (quote it, '{node.value}', if you mean the text)"
            raise self.error(node, path, f"expected a string, got {_describe(value, node)}{hint}")
        return value

    def name(self, node: Node, path: str, text: str | None = None) -> str:
        """A name matching NAME_PATTERN; ``text`` is a key's text, already a string."""
        text = self.string(node, path) if text is None else text
        if not NAME_PATTERN.fullmatch(text):
            raise self.error(node, path, f"invalid name {text!r}: use lower-case letters, "
                             "digits, '-' and '_', starting with a letter or digit")
        return text

    def choice(self, node: Node, path: str, choices: Collection[str], what: str) -> str:
        text = self.string(node, path)
        if text not in choices:
            raise self.error(node, path, f"unknown {what} {text!r}{_suggest(text, choices)}; "
                             f"use one of {', '.join(choices)}")
        return text

    def boolean(self, node: Node, path: str) -> bool:
        value = self.value(node, path)
        if not isinstance(value, bool):
            raise self.mismatch(node, path, "true or false", value)
        return value

    def integer(self, node: Node, path: str, minimum: int | None = None,
                maximum: int | None = None) -> int:
        """An integer in [minimum, maximum]; a YAML bool or float is not one."""
        if maximum is not None:
            expected = f"an integer from {minimum} to {maximum}"
        elif minimum == 1:
            expected = "a positive integer"
        elif minimum == 0:
            expected = "a non-negative integer"
        else:
            expected = "an integer"
        value = self.value(node, path)
        if (not isinstance(value, int) or isinstance(value, bool)
                or (minimum is not None and value < minimum)
                or (maximum is not None and value > maximum)):
            raise self.mismatch(node, path, expected, value)
        return value

    def number(self, node: Node, path: str, expected: str, positive: bool = False,
               maximum: float | None = None, infinite: bool = False) -> float:
        """A finite int or float (``.inf`` too, if ``infinite``), at least 0 (above 0 if
        ``positive``, at most ``maximum``)."""
        value = self.value(node, path)
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and (math.isfinite(value) or (infinite and value == math.inf))
              and (value > 0 if positive else value >= 0)
              and (maximum is None or value <= maximum))
        if not ok:
            raise self.mismatch(node, path, expected, value)
        return float(value)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# The file and its header


def _open(path: str | Path) -> tuple[_Reader, Node]:
    """Read and compose ``path``; return its reader and its top-level node."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ScenarioError(file, f"cannot read the file ({reason}); check the path") from None
    reader = _Reader(file)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(file, exc) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise ScenarioError(Location(file, line, column, "(yaml)"),
                            f"unacceptable character #x{exc.character:04x}; remove it") from None
    if root is None or (isinstance(root, ScalarNode) and root.tag == "tag:yaml.org,2002:null"):
        raise ScenarioError(Location(file, 1, 1, ROOT),
                            f"the file is empty; start it with apiVersion: {API_VERSION}, "
                            "kind, metadata and spec")
    return reader, root


def _syntax_error(file: str, exc: yaml.MarkedYAMLError) -> ScenarioError:
    mark = exc.problem_mark or exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    problem = exc.problem or "invalid YAML"
    if exc.context and problem.startswith("but "):
        # PyYAML splits some messages: "expected a single document" / "but found another".
        message = f"{exc.context}, {problem}"
    elif exc.context and exc.context_mark:
        # "while parsing a flow mapping" at the '{' tells which bracket is left open.
        context_at = f"line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
        message = f"{problem} ({exc.context} at {context_at})"
    else:
        message = problem
    if "'\\t'" in message:
        message += "; indent with spaces, not tabs"
    elif "expected <block end>" in message:
        message += "; check this line's indentation"
    return ScenarioError(Location(file, line, column, "(yaml)"), message)


def _header(reader: _Reader, root: Node) -> tuple[str, _Fields]:
    """Check apiVersion and kind (first, since a file of another version or kind would fail
    on its keys confusingly) and the top-level keys; return the kind and the top mapping."""
    top = reader.fields(root, ROOT, "a mapping with keys " + ", ".join(TOP_KEYS))
    for key in ("apiVersion", "kind"):
        if key not in top:
            raise reader.error(root, ROOT, f"missing the required key {key!r}; the file "
                               f"starts with apiVersion: {API_VERSION} and kind: Scenario "
                               "or Suite")
    version = reader.string(top.values["apiVersion"], "apiVersion")
    if version != API_VERSION:
        raise reader.error(top.values["apiVersion"], "apiVersion",
                           f"unsupported apiVersion {version!r}; use {API_VERSION}")
    kind = reader.choice(top.values["kind"], "kind", KINDS, "kind")
    reader.allow(top, TOP_KEYS)
    reader.require(top, ("metadata", "spec"), "the document")
    return kind, top


def _expect_kind(reader: _Reader, top: _Fields, kind: str, expected: str) -> None:
    if kind != expected:
        raise reader.error(top.values["kind"], "kind",
                           f"this is a {kind} file, but a {expected} was expected; "
                           f"pass a {expected} file here")


# --------------------------------------------------------------------------------------------
# Scenario


def _scenario(reader: _Reader, top: _Fields, path: Path) -> Scenario:
    meta = reader.mapping(top.values["metadata"], "metadata",
                          ("name", "description", "dangerous", "tags"), ("name",))
    name = reader.name(meta.values["name"], "metadata.name")
    description = _optional_string(reader, meta, "description")
    dangerous = reader.boolean(meta.values["dangerous"], "metadata.dangerous") \
        if "dangerous" in meta else False
    tags: tuple[str, ...] = ()
    if "tags" in meta:
        items = reader.sequence(meta.values["tags"], "metadata.tags", "a list of strings",
                                nonempty=False)
        tags = tuple(reader.string(n, f"metadata.tags[{i}]") for i, n in enumerate(items))

    spec = reader.mapping(top.values["spec"], "spec",
                          ("pool", "trials", "timeout", "variants", "amplify", "steps",
                           "workload"), ("pool", "variants"))
    pool = _pool(reader, spec.values["pool"], "spec.pool")
    trials = reader.integer(spec.values["trials"], "spec.trials", 1) \
        if "trials" in spec else 100
    timeout = reader.number(spec.values["timeout"], "spec.timeout",
                            "a positive number of seconds", positive=True) \
        if "timeout" in spec else 10.0
    variants = _variants(reader, spec.values["variants"], "spec.variants")

    steps: tuple[Step, ...] = ()
    workload: Workload | None = None
    if "steps" in spec and "workload" in spec:
        later = max(("steps", "workload"), key=lambda k: spec.keys[k].start_mark.index)
        raise reader.error(spec.keys[later], spec.sub(later),
                           "a scenario has either steps or a workload, not both; remove one")
    if "steps" in spec:
        steps = _Steps(reader).parse(spec.values["steps"], "spec.steps")
    elif "workload" in spec:
        workload = _workload(reader, spec.values["workload"], "spec.workload")
    else:
        raise reader.error(spec.node, "spec", "a scenario needs steps (a list of steps) or a "
                           "workload; add one")

    amplify = _amplify(reader, spec.values["amplify"], "spec.amplify", steps, workload) \
        if "amplify" in spec else None
    return Scenario(name=name, path=path, description=description, dangerous=dangerous,
                    pool=pool, trials=trials, timeout_s=timeout, variants=variants,
                    amplify=amplify, steps=steps, workload=workload, tags=tags)


def _optional_string(reader: _Reader, fields: _Fields, key: str) -> str:
    return reader.string(fields.values[key], fields.sub(key)) if key in fields else ""


def _pool(reader: _Reader, node: Node, path: str) -> PoolSpec:
    f = reader.mapping(node, path, ("pages", "page_tokens", "planes", "table_rows",
                                    "max_pages_per_row"), ("pages",), what="the pool")
    defaults = PoolSpec(pages=1)
    planes = defaults.planes
    if "planes" in f:
        items = reader.sequence(f.values["planes"], f.sub("planes"), "a non-empty list of planes")
        planes = tuple(_plane(reader, n, f"{f.sub('planes')}[{i}]") for i, n in enumerate(items))

    def count(key: str, default: int, minimum: int = 1) -> int:
        return reader.integer(f.values[key], f.sub(key), minimum) if key in f else default

    pages = reader.integer(f.values["pages"], f.sub("pages"), 1)
    return PoolSpec(pages=pages, page_tokens=count("page_tokens", defaults.page_tokens),
                    planes=planes, table_rows=count("table_rows", defaults.table_rows),
                    max_pages_per_row=count("max_pages_per_row", 0, minimum=0))


def _plane(reader: _Reader, node: Node, path: str) -> PlaneSpec:
    f = reader.mapping(node, path, ("dtype", "leading", "heads", "align"),
                       ("dtype", "leading", "heads"), what="a plane")
    dtype = reader.choice(f.values["dtype"], f.sub("dtype"), DTYPES, "dtype")
    align = 256
    if "align" in f:
        align = reader.integer(f.values["align"], f.sub("align"), 1)
        if align & (align - 1):
            raise reader.error(f.values["align"], f.sub("align"),
                               f"align must be a power of two (64, 128, 256...), not {align}")
    return PlaneSpec(dtype=dtype, leading=reader.integer(f.values["leading"], f.sub("leading"), 1),
                     heads=reader.integer(f.values["heads"], f.sub("heads"), 1), align=align)


def _variants(reader: _Reader, node: Node, path: str) -> tuple[Variant, ...]:
    f = reader.fields(node, path, "a mapping of variant names to variants")
    if not f.values:
        raise reader.error(node, path, "a scenario needs at least one variant, e.g. "
                           "buggy: {defects: {release_fence: false}, expect: reproduces}")
    return tuple(_variant(reader, f, name) for name in f.values)


def _variant(reader: _Reader, variants: _Fields, name: str) -> Variant:
    path = variants.sub(name)
    reader.name(variants.keys[name], path, text=name)
    f = reader.mapping(variants.values[name], path, ("defects", "expect", "min_rate"),
                       what=f"variant {name!r}")
    defects = kvcore.Defects()
    if "defects" in f:
        d = reader.mapping(f.values["defects"], f.sub("defects"), kvcore.Defects.names())
        defects = kvcore.Defects(**{key: reader.boolean(value, d.sub(key))
                                    for key, value in d.values.items()})
    expect = reader.choice(f.values["expect"], f.sub("expect"), EXPECTATIONS, "expectation") \
        if "expect" in f else "clean"
    min_rate = reader.number(f.values["min_rate"], f.sub("min_rate"), "a number from 0 to 1",
                             maximum=1.0) if "min_rate" in f else 0.0
    return Variant(name=name, defects=defects, expect=expect, min_rate=min_rate)


def _workload(reader: _Reader, node: Node, path: str) -> Workload:
    f = reader.mapping(node, path, ("kind", "requests", "initial_pages", "pages_per_turn",
                                    "churn_pages", "path"), ("kind",), what="the workload")
    kind = reader.choice(f.values["kind"], f.sub("kind"), WORKLOAD_KINDS, "workload kind")
    if kind == "ticket":
        if "path" not in f:
            raise reader.error(node, path, "a ticket workload needs `path:` (a "
                                           "gpurace.ticket/1 file, relative to this file)")
        ticket = Path(reader.file).parent / reader.string(f.values["path"], f.sub("path"))
        if not ticket.is_file():
            raise reader.error(f.values["path"], f.sub("path"),
                               f"no ticket file at {ticket}; record one or fix the path")
        return Workload(kind=kind, ticket=ticket)
    if "path" in f:
        raise reader.error(f.values["path"], f.sub("path"),
                           "`path` belongs to a ticket workload (kind: ticket)")
    defaults = Workload()
    minimums = {"requests": 1, "initial_pages": 0, "pages_per_turn": 1, "churn_pages": 0}
    counts = {key: reader.integer(f.values[key], f.sub(key), minimum) if key in f
              else getattr(defaults, key) for key, minimum in minimums.items()}
    return Workload(kind=kind, **counts)


def _amplify(reader: _Reader, node: Node, path: str, steps: tuple[Step, ...],
             workload: Workload | None) -> Amplify:
    f = reader.mapping(node, path, ("delay_us", "stream", "before", "sweep"),
                       ("delay_us", "stream", "before"), what="amplify")
    delay = reader.number(f.values["delay_us"], f.sub("delay_us"),
                          "a non-negative number of microseconds")
    stream = STREAMS[reader.choice(f.values["stream"], f.sub("stream"), STREAMS, "stream")]
    sweep: tuple[float, ...] = ()
    if "sweep" in f:
        items = reader.sequence(f.values["sweep"], f.sub("sweep"),
                                "a list of delays in microseconds", nonempty=False)
        sweep = tuple(reader.number(n, f"{f.sub('sweep')}[{i}]",
                                    "a non-negative number of microseconds")
                      for i, n in enumerate(items))
    before_node, before_path = f.values["before"], f.sub("before")
    if workload is not None:
        before = reader.choice(before_node, before_path, WORKLOAD_PHASES, "workload phase")
    else:
        before = reader.string(before_node, before_path)
        ids = [s.id for s in steps if s.id is not None]
        if before not in ids:
            known = f"step ids: {', '.join(ids)}" if ids else \
                "no step has an id; give the step to delay one"
            raise reader.error(before_node, before_path,
                               f"no step has id {before!r}{_suggest(before, ids)}; {known}")
    return Amplify(delay_us=delay, stream=stream, before=before, sweep=sweep)


# --------------------------------------------------------------------------------------------
# Steps


class _Steps:
    """Parses a step list top to bottom, tracking the names defined so far, so that a step may
    only refer to what an earlier step defined (the order the executor runs them in)."""

    def __init__(self, reader: _Reader) -> None:
        self.reader = reader
        self.ids: dict[str, int] = {}
        self.defined: dict[str, list[str]] = {kind: [] for kind in _HOW_TO_DEFINE}
        self.nodes: list[Node] = []
        self.index = 0

    def parse(self, node: Node, path: str) -> tuple[Step, ...]:
        self.nodes = self.reader.sequence(node, path, "a non-empty list of steps")
        return tuple(self.step(n, f"{path}[{i}]", i) for i, n in enumerate(self.nodes))

    def step(self, node: Node, path: str, index: int) -> Step:
        reader = self.reader
        self.index = index
        f = reader.fields(node, path, "a step (a mapping with an op)")
        if "op" not in f:
            raise reader.error(node, path, f"a step needs an op; use one of {', '.join(STEP_OPS)}")
        op = reader.choice(f.values["op"], f.sub("op"), STEP_OPS, "op")
        keys = STEP_OPS[op]
        reader.allow(f, ("id", "op", *keys["required"], *keys["optional"]), f" for op {op}")
        reader.require(f, keys["required"], f"a {op} step")
        step_id = self.step_id(f, index) if "id" in f else None
        if step_id is None and (op, "id") in _DEFINES:
            raise reader.error(node, path, f"a {op} step needs an id: it names the "
                               f"{_DEFINES[(op, 'id')]} later steps refer to")
        if op == "check":
            self.check_choices(f)
        args = {key: self.arg(op, key, value, f.sub(key))
                for key, value in f.values.items() if key not in ("id", "op")}
        # Defined after the arguments are read: a step cannot refer to its own name.
        for (defining_op, key), kind in _DEFINES.items():
            if defining_op == op:
                defined = str(step_id if key == "id" else args[key])
                if defined not in self.defined[kind]:
                    self.defined[kind].append(defined)
        return Step(op=op, args=args, id=step_id, index=index, where=reader.where(node, path))

    def step_id(self, f: _Fields, index: int) -> str:
        node, path = f.values["id"], f.sub("id")
        step_id = self.reader.name(node, path)
        if step_id in self.ids:
            raise self.reader.error(node, path, f"duplicate step id {step_id!r}: "
                                    f"steps[{self.ids[step_id]}] already has it; rename one")
        self.ids[step_id] = index
        return step_id

    def check_choices(self, f: _Fields) -> None:
        for keys, meaning in _CHECK_CHOICES:
            present = [k for k in keys if k in f]
            if len(present) != 1:
                found = "both" if present else "neither"
                raise self.reader.error(f.node, f.path, f"a check step needs exactly one of "
                                        f"{meaning}; it has {found}")

    def arg(self, op: str, key: str, node: Node, path: str) -> object:
        reader = self.reader
        kind = arg_kind(op, key)
        if kind == "stream":
            return STREAMS[reader.choice(node, path, STREAMS, "stream")]
        if kind == "count":
            return reader.integer(node, path, 1)
        if kind == "byte":
            return reader.integer(node, path, 0, 255)
        if kind == "duration":
            # .inf is a kernel that never ends: how a scenario provokes a hang on purpose.
            return reader.number(node, path, "a positive number of microseconds (or .inf)",
                                 positive=True, infinite=True)
        if kind == "bool":
            return reader.boolean(node, path)
        if kind == "name":
            return reader.name(node, path)
        return self.reference(kind, node, path)

    def reference(self, kind: str, node: Node, path: str) -> str:
        """A name of ``kind`` (lease, catalog, buffer, event) that an earlier step defined."""
        name = self.reader.string(node, path)
        known = self.defined[kind]
        if name in known:
            return name
        later = self.defined_later(kind, name, self.index)
        verb = "recorded" if kind == "event" else "defined"
        if later is not None:
            message = (f"unknown {kind} {name!r}: steps[{later}] defines it, after this "
                       "step; move that step before this one")
        elif known:
            message = (f"unknown {kind} {name!r}{_suggest(name, known)}; "
                       f"{verb} so far: {', '.join(known)}")
        else:
            message = (f"unknown {kind} {name!r}; none is {verb} before this step "
                       f"({_HOW_TO_DEFINE[kind]})")
        raise self.reader.error(node, path, message)

    def defined_later(self, kind: str, name: str, index: int) -> int | None:
        """The index of a later step that would define ``name``, read leniently from the
        raw nodes: it only shapes the message of an error already found."""
        for later in range(index + 1, len(self.nodes)):
            raw = _raw_scalars(self.nodes[later])
            for (op, key), defined_kind in _DEFINES.items():
                if defined_kind == kind and raw.get("op") == op and raw.get(key) == name:
                    return later
        return None


def _raw_scalars(node: Node) -> dict[str, str]:
    if not isinstance(node, MappingNode):
        return {}
    return {k.value: v.value for k, v in node.value
            if isinstance(k, ScalarNode) and isinstance(v, ScalarNode)}


# --------------------------------------------------------------------------------------------
# Suite


def _suite(reader: _Reader, top: _Fields, path: Path) -> Suite:
    meta = reader.mapping(top.values["metadata"], "metadata", ("name", "description"),
                          ("name",))
    name = reader.name(meta.values["name"], "metadata.name")
    description = _optional_string(reader, meta, "description")
    spec = reader.mapping(top.values["spec"], "spec", ("scenarios",), ("scenarios",))
    items = reader.sequence(spec.values["scenarios"], "spec.scenarios",
                            "a non-empty list of scenario file paths")
    folder = path.parent
    scenarios: list[Path] = []
    for i, item in enumerate(items):
        item_path = f"spec.scenarios[{i}]"
        resolved = (folder / reader.string(item, item_path)).resolve()
        if not resolved.is_file():
            raise reader.error(item, item_path, f"no scenario file at {resolved} (paths are "
                               f"relative to the suite's folder, {folder.resolve()})")
        if resolved in scenarios:
            raise reader.error(item, item_path, f"{resolved} is listed twice; remove one")
        scenarios.append(resolved)
    return Suite(name=name, path=path, description=description, scenarios=tuple(scenarios))
