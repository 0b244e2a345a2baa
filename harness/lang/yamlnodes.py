"""Reading YAML with its positions: PyYAML's node tree turned into checked Python values, or
errors that point at the node to fix (``file:line:col: path: what is wrong``).

Only nodes remember where they were written, so the scenario loader walks nodes, never the
constructed Python objects.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness.errors import ScenarioError
from harness.inputs import Unreadable, clip, echo, plain, read_input, utf8_error_at
from harness.limits import (
    ECHO_MAX_CHARS,
    NAME_MAX_CHARS,
    TEXT_MAX_CHARS,
    YAML_MAX_BYTES,
    YAML_MAX_DEPTH,
    YAML_MAX_NODES,
)
from harness.lang.model import Location
from harness.traces.kinds import wrong_kind

ROOT = "(document)"
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]*")
"""Scenario, suite, variant, stream, step, buffer and event names (matched whole)."""
API_VERSION = "gpurace/v1"


@dataclass
class Fields:
    """A YAML mapping whose keys are known to be unique strings, in document order."""

    node: MappingNode
    path: str
    keys: dict[str, Node]
    values: dict[str, Node]

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def sub(self, key: str) -> str:
        return sub_path(self.path, key)


def sub_path(path: str, key: str) -> str:
    # A key is the file's text: kept to one short printable line in the path of a message.
    key = clip(plain(key))
    return key if path == ROOT else f"{path}.{key}"


def suggest(word: str, choices: Collection[str]) -> str:
    if len(word) > NAME_MAX_CHARS:
        return ""  # nothing that long is close to a name (and difflib's time grows with it)
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _short_tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


def describe(value: object, node: Node) -> str:
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
        return f"the string {echo(value)}"
    if isinstance(value, (int, float)):
        return echo(value)
    return f"a {type(value).__name__} ({echo(node.value)})"


def over(value: float, limit: float, what: str) -> str:
    """The message for a value above its limit (from harness.limits): what, the limit, what to
    do."""
    shown = f"{limit:.0f}" if isinstance(limit, float) and limit.is_integer() else str(limit)
    return f"{echo(value)} is more than {shown}, the most {what}; use a smaller value"


class Reader:
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

    def is_null(self, node: Node) -> bool:
        """Whether a plain scalar (a key's text, say) is what YAML reads as null."""
        return isinstance(node, ScalarNode) and node.style is None and \
            self._loader.resolve(ScalarNode, node.value, (True, False)) == "tag:yaml.org,2002:null"

    def value(self, node: Node, path: str) -> object:
        """The Python value of a scalar node; mappings and lists come back as their node."""
        if not isinstance(node, ScalarNode):
            return node
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError:
            raise self.error(node, path,
                             f"unsupported tag {_short_tag(node.tag)}; remove it") from None
        except (ValueError, TypeError, OverflowError):
            # An explicit tag the text does not fit: !!int abc.
            raise self.error(node, path, f"{echo(node.value)} cannot be read as "
                             f"{_short_tag(node.tag)}; remove the tag or fix the value") from None

    def mismatch(self, node: Node, path: str, expected: str, value: object) -> ScenarioError:
        return self.error(node, path, f"expected {expected}, got {describe(value, node)}")

    def fields(self, node: Node, path: str, expected: str) -> Fields:
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
            key_path = sub_path(path, key)
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise self.error(key_node, key_path, "merge keys (<<) are not supported; "
                                 "write the keys out")
            if key in keys:
                first = keys[key].start_mark
                raise self.error(key_node, key_path,
                                 f"duplicate key {echo(key)} (first at line {first.line + 1}, "
                                 f"column {first.column + 1}); keep one")
            keys[key] = key_node
            values[key] = value_node
        return Fields(node, path, keys, values)

    def plain_tag(self, node: Node, path: str, tag: str) -> None:
        """Reject tagged collections (!!set, !!omap, !foo): they mean something else."""
        if node.tag != tag:
            raise self.error(node, path, f"unsupported tag {_short_tag(node.tag)}; remove it")

    def allow(self, fields: Fields, allowed: Sequence[str], context: str = "") -> None:
        """Reject keys not in ``allowed``, at the first such key."""
        for key, key_node in fields.keys.items():
            if key not in allowed:
                raise self.error(key_node, fields.sub(key),
                                 f"unknown key {echo(key)}{context}{suggest(key, allowed)}; "
                                 f"allowed keys: {', '.join(allowed)}")

    def require(self, fields: Fields, required: Sequence[str], what: str) -> None:
        for key in required:
            if key not in fields:
                raise self.error(fields.node, fields.path,
                                 f"{what} is missing the required key {key!r}; add it")

    def mapping(self, node: Node, path: str, allowed: Sequence[str],
                required: Sequence[str] = (), what: str = "") -> Fields:
        """A mapping with only ``allowed`` keys and every ``required`` one."""
        what = what or path
        fields = self.fields(node, path, f"a mapping with keys {', '.join(allowed)}")
        self.allow(fields, allowed)
        self.require(fields, required, what)
        return fields

    def sequence(self, node: Node, path: str, expected: str,
                 nonempty: bool = True, limit: int | None = None, what: str = "") -> list[Node]:
        """A list; with ``limit``, of at most that many items (``what`` names them)."""
        if not isinstance(node, SequenceNode):
            raise self.mismatch(node, path, expected, self.value(node, path))
        self.plain_tag(node, path, "tag:yaml.org,2002:seq")
        if nonempty and not node.value:
            raise self.error(node, path, f"expected {expected}, got an empty list")
        if limit is not None:
            self.at_most(node, path, len(node.value), limit, what)
        return list(node.value)

    def one_or_list(self, node: Node, path: str, expected: str, limit: int | None = None,
                    what: str = "") -> list[tuple[Node, str]]:
        """A value written as one item or a list of them (``only: fixed``, ``only: [a, b]``):
        each item with its path."""
        if not isinstance(node, SequenceNode):
            return [(node, path)]
        items = self.sequence(node, path, expected, limit=limit, what=what)
        return [(item, f"{path}[{i}]") for i, item in enumerate(items)]

    def at_most(self, node: Node, path: str, count: int, limit: int, what: str,
                whose: str = "a file may have") -> None:
        """Refuse ``count`` items (``what``: "streams") where ``limit`` is the most ``whose``."""
        if count > limit:
            raise self.error(node, path, f"{count} {what} is more than {limit}, the most "
                             f"{whose}; use fewer")

    def string(self, node: Node, path: str) -> str:
        value = self.value(node, path)
        if not isinstance(value, str):
            hint = ""
            if isinstance(node, ScalarNode) and node.style is None and value is not None:
                hint = f" (quote it, '{clip(plain(node.value))}', if you mean the text)"
            raise self.error(node, path, f"expected a string, got {describe(value, node)}{hint}")
        return value

    def name(self, node: Node, path: str, text: str | None = None) -> str:
        """A name matching NAME_PATTERN, at most NAME_MAX_CHARS long; ``text`` is a key's text,
        already a string."""
        text = self.string(node, path) if text is None else text
        if len(text) > NAME_MAX_CHARS:
            raise self.error(node, path, f"a name of {len(text)} characters ({echo(text)}); a "
                             f"name has at most {NAME_MAX_CHARS}: shorten it")
        if not NAME_PATTERN.fullmatch(text):
            raise self.error(node, path, f"invalid name {echo(text)}: use lower-case letters, "
                             "digits, '-' and '_', starting with a letter or digit")
        return text

    def choice(self, node: Node, path: str, choices: Collection[str], what: str) -> str:
        text = self.string(node, path)
        if text not in choices:
            raise self.error(node, path, f"unknown {what} {echo(text)}{suggest(text, choices)}; "
                             f"use one of {', '.join(choices)}")
        return text

    def boolean(self, node: Node, path: str) -> bool:
        value = self.value(node, path)
        if not isinstance(value, bool):
            raise self.mismatch(node, path, "true or false", value)
        return value

    def integer(self, node: Node, path: str, minimum: int | None = None,
                maximum: int | None = None, *, limit: int | None = None,
                what: str = "") -> int:
        """An integer in [minimum, maximum]; a YAML bool or float is not one. ``limit`` is an
        upper bound from harness.limits, said as one: ``what`` names what it bounds."""
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
        if limit is not None and value > limit:
            raise self.error(node, path, over(value, limit, what))
        return value

    def number(self, node: Node, path: str, expected: str, positive: bool = False,
               maximum: float | None = None, infinite: bool = False, *,
               limit: float | None = None, what: str = "") -> float:
        """A finite int or float (``.inf`` too, if ``infinite``), at least 0 (above 0 if
        ``positive``, at most ``maximum``); a finite one at most ``limit`` (from
        harness.limits; ``what`` names what it bounds)."""
        value = self.value(node, path)
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and (math.isfinite(value) or (infinite and value == math.inf))
              and (value > 0 if positive else value >= 0)
              and (maximum is None or value <= maximum))
        if not ok:
            raise self.mismatch(node, path, expected, value)
        if limit is not None and math.isfinite(value) and value > limit:  # type: ignore
            raise self.error(node, path, over(value, limit, what))  # type: ignore[arg-type]
        return float(value)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# The file and its header


def open_yaml(path: str | Path) -> tuple[Reader, Node]:
    """Read and compose ``path``; return its reader and its top-level node."""
    file = str(path)
    try:
        data = read_input(path, YAML_MAX_BYTES, "a scenario or suite file")
    except Unreadable as exc:
        raise ScenarioError(Location(file, 1, 1, "(file)"), str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = utf8_error_at(data, exc.start)
        raise ScenarioError(Location(file, line, column, "(yaml)"),
                            f"not UTF-8 text (byte {data[exc.start]:#04x}); save the file as "
                            "UTF-8") from None
    reader = Reader(file)
    loader = None
    try:
        # In the try: PyYAML looks for characters YAML forbids (a NUL) as the loader is made.
        loader = _BoundedLoader(text, file)
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        wrong = wrong_kind(text, "a scenario")
        if wrong is not None and not wrong.startswith("this is a suite"):
            raise ScenarioError(Location(file, 1, 1, "(file)"),
                                wrong.replace("not a scenario", "not a scenario or suite")
                                ) from None
        raise _syntax_error(file, exc) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise ScenarioError(Location(file, line, column, "(yaml)"),
                            f"unacceptable character #x{exc.character:04x}; remove it") from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is None or (isinstance(root, ScalarNode) and root.tag == "tag:yaml.org,2002:null"):
        raise ScenarioError(Location(file, 1, 1, ROOT),
                            f"the file is empty; start it with apiVersion: {API_VERSION}, "
                            "kind, metadata and spec")
    return reader, root


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the limits of harness.limits checked as each node is composed,
    before it is: nesting (PyYAML composes recursively, so a deep document would exhaust
    Python's stack), the number of nodes (an alias counted as a copy of the nodes it names, so
    that no walk of the document is longer than the limit) and the length of each scalar.
    The composer also keeps each node's document path, for the message."""

    def __init__(self, text: str, file: str) -> None:
        super().__init__(text)
        self.file = file
        self.depth = 0
        self.nodes = 0
        self.sizes: dict[str, int] = {}  # anchor -> nodes it stands for
        self.paths = [ROOT]

    def compose_node(self, parent: Node | None, index: object) -> Node:
        event = self.peek_event()
        path = self._path(parent, index)
        if isinstance(event, AliasEvent):
            # An undefined alias counts 1; PyYAML then says it is undefined.
            self._count(self.sizes.get(event.anchor, 1), event, path)
            return super().compose_node(parent, index)
        nested = isinstance(event, (SequenceStartEvent, MappingStartEvent))
        if nested and self.depth >= YAML_MAX_DEPTH:
            raise self._error(event, path, f"nested deeper than {YAML_MAX_DEPTH} mappings and "
                              "lists (a scenario needs 5); flatten it")
        if isinstance(event, ScalarEvent) and len(event.value) > TEXT_MAX_CHARS:
            raise self._error(event, path, f"a value of {len(event.value):,} characters; a "
                              f"value has at most {TEXT_MAX_CHARS} (a name {NAME_MAX_CHARS}): "
                              "shorten it")
        before = self.nodes
        self._count(1, event, path)
        self.paths.append(path)
        self.depth += nested
        try:
            node = super().compose_node(parent, index)
        finally:
            self.paths.pop()
            self.depth -= nested
        if event.anchor is not None:
            self.sizes[event.anchor] = self.nodes - before
        return node

    def _path(self, parent: Node | None, index: object) -> str:
        if parent is None:
            return ROOT
        at = self.paths[-1]
        if isinstance(index, int):
            return f"{at}[{index}]"
        if isinstance(index, ScalarNode):
            return sub_path(at, index.value)
        return at  # a key, or a value under a key that is not a scalar

    def _count(self, nodes: int, event: yaml.Event, path: str) -> None:
        self.nodes += nodes
        if self.nodes > YAML_MAX_NODES:
            raise self._error(event, path, f"more than {YAML_MAX_NODES:,} values in the "
                              "document (an alias counts as a copy of what it names); a "
                              "scenario of 2,048 steps needs about 20,000: split the file")

    def _error(self, event: yaml.Event, path: str, message: str) -> ScenarioError:
        mark = event.start_mark
        if len(path) > 2 * ECHO_MAX_CHARS:  # 64 levels deep: its start and its end say where
            path = f"{path[:ECHO_MAX_CHARS // 2]}…{path[-ECHO_MAX_CHARS:]}"
        return ScenarioError(Location(self.file, mark.line + 1, mark.column + 1, path), message)


def _syntax_error(file: str, exc: yaml.MarkedYAMLError) -> ScenarioError:
    mark = exc.problem_mark or exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    # PyYAML quotes the file (an alias, an escape): one short printable line of it.
    problem = clip(plain(exc.problem or "invalid YAML"), 200)
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

