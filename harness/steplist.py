"""The step list of a scenario: parsed top to bottom and checked once per variant.

A step may run in some variants only (``only: fixed``, ``unless: [buggy]``), so what a name
refers to depends on the variant: a lease that a buggy-only step made does not exist in the
fixed variant. The parser keeps one scope per variant and checks every reference in each
variant the step runs in, so a reference that is valid in one variant and not in another is an
error naming both steps, each at its file:line:col. Names that are given back (a released
lease, a freed pinned buffer) may not be used or given back again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness import vocabulary as V
from harness.model import STREAM_ALIASES, Location, StreamSpec, Step
from harness.yamlnodes import Fields, Reader, suggest

_PLURAL = {"lease": "leases", "catalog": "catalogs", "buffer": "buffers", "event": "events"}


@dataclass
class _Scope:
    """What one variant has seen so far, step by step."""

    ids: dict[str, int] = field(default_factory=dict)
    names: dict[tuple[str, str], int] = field(default_factory=dict)  # -> defining step
    gone: dict[tuple[str, str], int] = field(default_factory=dict)   # -> step that gave it back
    allocated: dict[str, int] = field(default_factory=dict)  # host_alloc'd buffer -> pages
    lease_pages: dict[str, int] = field(default_factory=dict)


@dataclass
class _Range:
    """A byte range a step asks of a world buffer, checked once every step is read (a world
    buffer is as large as its largest use)."""

    node: Node
    path: str
    buffer: str
    page_end: int  # pages the step needs the buffer to have
    byte_end: int  # bytes likewise (0: none)


class StepList:
    """Parses ``spec.steps`` (see the module docstring)."""

    def __init__(self, reader: Reader, variants: Sequence[str], streams: Sequence[StreamSpec],
                 declared: bool, page_bytes: int) -> None:
        self.reader = reader
        self.variants = tuple(variants)
        self.streams = {s.name: s for s in streams}
        self.declared = declared
        self.page_bytes = page_bytes
        self.scopes = {v: _Scope() for v in self.variants}
        self.nodes: list[Node] = []
        self.where: list[Location] = []
        self.runs_everywhere: list[bool] = []
        self.index = 0
        self.world_pages: dict[str, int] = {}  # world buffer -> pages
        self.ranges: list[_Range] = []

    # ---- the list ------------------------------------------------------------------------------
    def parse(self, node: Node, path: str) -> tuple[Step, ...]:
        self.nodes = self.reader.sequence(node, path, "a non-empty list of steps")
        steps = tuple(self.step(n, f"{path}[{i}]", i) for i, n in enumerate(self.nodes))
        self.check_world_ranges()
        return steps

    def step(self, node: Node, path: str, index: int) -> Step:
        reader = self.reader
        self.index = index
        f = reader.fields(node, path, "a step (a mapping with an op)")
        self.where.append(reader.where(node, path))
        if "op" not in f:
            raise reader.error(node, path, f"a step needs an op; use one of {', '.join(V.OPS)}")
        op = reader.choice(f.values["op"], f.sub("op"), V.OPS, "op")
        spec = V.OPS[op]
        reader.allow(f, ("id", "op", *V.VARIANT_KEYS, *spec.keys), f" for op {op}")
        reader.require(f, spec.required(), f"a {op} step")
        runs = self.variants_of(f)
        self.runs_everywhere.append(len(runs) == len(self.variants))
        step_id = self.step_id(f, index, runs) if "id" in f else None
        if step_id is None and spec.id_defines:
            raise reader.error(node, path, f"a {op} step needs an id: it names the "
                               f"{spec.id_defines} later steps refer to")
        self.choices(f, spec)
        args = {key: self.arg(op, key, value, f.sub(key), runs)
                for key, value in f.values.items() if key not in ("id", "op", *V.VARIANT_KEYS)}
        self.effects(f, op, step_id, args, runs)
        only = None if len(runs) == len(self.variants) else frozenset(runs)
        return Step(op=op, args=args, id=step_id, index=index, where=self.where[index],
                    only=only)

    def variants_of(self, f: Fields) -> tuple[str, ...]:
        """The variants a step runs in, from its ``only`` or ``unless``."""
        present = [k for k in V.VARIANT_KEYS if k in f]
        if not present:
            return self.variants
        if len(present) == 2:
            raise self.reader.error(f.keys["unless"], f.sub("unless"),
                                    "a step has `only` or `unless`, not both; keep one")
        key = present[0]
        node, path = f.values[key], f.sub(key)
        items = self.reader.sequence(node, path, "a variant name or a list of them") \
            if isinstance(node, SequenceNode) else [node]
        named = []
        for i, item in enumerate(items):
            item_path = f"{path}[{i}]" if isinstance(node, SequenceNode) else path
            name = self.reader.string(item, item_path)
            if name not in self.variants:
                raise self.reader.error(item, item_path, f"unknown variant {name!r}"
                                        f"{suggest(name, self.variants)}; this scenario's "
                                        f"variants are {', '.join(self.variants)}")
            named.append(name)
        runs = tuple(v for v in self.variants if (v in named) == (key == "only"))
        if not runs:
            raise self.reader.error(node, path, "with this, the step runs in no variant; "
                                    "remove the step or name fewer variants")
        return runs

    def step_id(self, f: Fields, index: int, runs: tuple[str, ...]) -> str:
        """A step id, unique within each variant (steps of disjoint variants may share one: the
        buggy and the fixed way of doing the same step)."""
        node, path = f.values["id"], f.sub("id")
        step_id = self.reader.name(node, path)
        for v in runs:
            other = self.scopes[v].ids.get(step_id)
            if other is None:
                continue
            everywhere = len(runs) == len(self.variants) and self.runs_everywhere[other]
            remedy = "rename one" if everywhere else \
                f"both run in variant {v}; rename one, or give them `only:` lists that do not " \
                "overlap"
            raise self.reader.error(node, path, f"duplicate step id {step_id!r}: steps[{other}] "
                                    f"({self._at(other)}) has it too; {remedy}")
        for v in runs:
            self.scopes[v].ids[step_id] = index
        return step_id

    def choices(self, f: Fields, spec: V.Op) -> None:
        for keys, meaning in spec.one_of:
            present = [k for k in keys if k in f]
            if len(present) != 1:
                found = "both" if present else "neither"
                raise self.reader.error(f.node, f.path, f"a check step needs exactly one of "
                                        f"{meaning}; it has {found}")
        both = [k for k in spec.at_most_one if k in f]
        if len(both) > 1:
            raise self.reader.error(f.keys[both[1]], f.sub(both[1]),
                                    f"give {' or '.join(spec.at_most_one)}, not both")

    # ---- one argument --------------------------------------------------------------------------
    def arg(self, op: str, key: str, node: Node, path: str, runs: tuple[str, ...]) -> object:
        reader = self.reader
        holds = V.holds(op, key)
        if holds == V.STREAM:
            return self.stream(node, path)
        if holds == V.COUNT:
            return reader.integer(node, path, 1)
        if holds == V.INDEX:
            return reader.integer(node, path, 0)
        if holds == V.PAGES:
            if isinstance(node, SequenceNode):
                items = reader.sequence(node, path, "a page number or a list of them")
                return tuple(reader.integer(n, f"{path}[{i}]", 0) for i, n in enumerate(items))
            return reader.integer(node, path, 0)
        if holds == V.BYTE:
            return reader.integer(node, path, 0, 255)
        if holds == V.DURATION:
            # .inf is a kernel that never ends: how a scenario provokes a hang on purpose.
            return reader.number(node, path, "a positive number of microseconds (or .inf)",
                                 positive=True, infinite=True)
        if holds == V.BOOL:
            return reader.boolean(node, path)
        if holds in (V.NEW_BUFFER, V.NEW_EVENT):
            name = reader.name(node, path)
            if holds == V.NEW_BUFFER:
                for v in runs:
                    self.not_gone(("buffer", name), v, node, path)
            return name
        if holds == V.ALLOC_BUFFER:
            return self.new_allocation(node, path, runs)
        if holds == V.EVENTS and isinstance(node, SequenceNode):
            items = reader.sequence(node, path, "an event or a list of events")
            return tuple(self.reference("event", n, f"{path}[{i}]", runs)
                         for i, n in enumerate(items))
        return self.reference(V.REFERENCES[holds], node, path, runs)

    def stream(self, node: Node, path: str) -> str:
        name = self.reader.string(node, path)
        if not self.declared:
            name = STREAM_ALIASES.get(name, name)
        if name not in self.streams:
            raise self.reader.error(node, path, unknown_stream(name, self.streams, self.declared))
        return name

    def new_allocation(self, node: Node, path: str, runs: tuple[str, ...]) -> str:
        name = self.reader.name(node, path)
        for v in runs:
            made = self.scopes[v].names.get(("buffer", name))
            if made is not None and ("buffer", name) not in self.scopes[v].gone:
                raise self.reader.error(node, path, f"buffer {name!r} exists already "
                                        f"(steps[{made}], {self._at(made)}, made it); free it "
                                        "with host_free first, or pick another name")
        return name

    def reference(self, kind: str, node: Node, path: str, runs: tuple[str, ...]) -> str:
        """A name of ``kind`` that an earlier step made, in every variant this step runs in."""
        name = self.reader.string(node, path)
        key = (kind, name)
        missing = [v for v in runs if key not in self.scopes[v].names]
        for v in runs:
            if v not in missing:
                self.not_gone(key, v, node, path)
        if not missing:
            return name
        having = [v for v in self.variants if key in self.scopes[v].names]
        if having:
            made = self.scopes[having[0]].names[key]
            raise self.reader.error(node, path, (
                f"{kind} {name!r} exists in variant {', '.join(having)} (steps[{made}], "
                f"{self._at(made)}, makes it) but not in variant {', '.join(missing)}, where "
                f"this step runs too; limit this step with `only: [{', '.join(having)}]`, or "
                f"make {name!r} in {', '.join(missing)} as well"))
        later = self.defined_later(kind, name)
        verb = "recorded" if kind == "event" else "defined"
        known = sorted({n for v in runs for (k, n) in self.scopes[v].names if k == kind})
        if later is not None:
            message = (f"unknown {kind} {name!r}: steps[{later}] defines it, after this "
                       "step; move that step before this one")
        elif known:
            message = (f"unknown {kind} {name!r}{suggest(name, known)}; {_PLURAL[kind]} "
                       f"{verb} so far: {', '.join(known)}")
        else:
            message = (f"unknown {kind} {name!r}; none is {verb} before this step "
                       f"({V.HOW_TO_DEFINE[kind]})")
        raise self.reader.error(node, path, message)

    def not_gone(self, key: tuple[str, str], variant: str, node: Node, path: str) -> None:
        scope = self.scopes[variant]
        gone = scope.gone.get(key)
        if gone is None:
            return
        kind, name = key
        verb, remedy = ("released", "materialize pages again") if kind == "lease" else \
            ("freed", "allocate it again with host_alloc")
        where = "" if self.runs_everywhere[gone] else f" in variant {variant}"
        op = self._op_at(self.index)
        if V.OPS[op].frees == (path.rsplit(".", 1)[-1], kind):
            raise self.reader.error(node, path, f"{kind} {name!r} is {verb} twice: steps[{gone}] "
                                    f"({self._at(gone)}) {verb} it already{where}; remove one "
                                    f"{op} step")
        raise self.reader.error(node, path, f"{kind} {name!r} was {verb} at steps[{gone}] "
                                f"({self._at(gone)}){where}; it cannot be used after that: "
                                f"{remedy}")

    # ---- what a step makes and gives back --------------------------------------------------------
    def effects(self, f: Fields, op: str, step_id: str | None, args: dict[str, object],
                runs: tuple[str, ...]) -> None:
        index = self.index
        freed = V.frees(op, args)
        if freed is not None:
            self.give_back(f, op, freed, runs)
        for v in runs:
            scope = self.scopes[v]
            for key in V.defines(op, step_id, args):
                scope.names[key] = index
                scope.gone.pop(key, None)
            if op == "materialize":
                scope.lease_pages[str(step_id)] = int(args["pages"])  # type: ignore[arg-type]
            elif op == "host_alloc":
                scope.allocated[str(args["buffer"])] = int(args.get("pages", 1))  # type: ignore
        self.sizes(f, op, args, runs)

    def give_back(self, f: Fields, op: str, key: tuple[str, str], runs: tuple[str, ...]) -> None:
        kind, name = key
        arg = V.OPS[op].frees[0]  # type: ignore[index]
        node, path = f.values[arg], f.sub(arg)
        for v in runs:
            scope = self.scopes[v]
            if kind == "buffer" and name not in scope.allocated:
                made = scope.names[key]
                raise self.reader.error(node, path, f"buffer {name!r} is a world buffer "
                                        f"(steps[{made}], {self._at(made)}, made it with "
                                        f"{self._op_at(made)}); only buffers from host_alloc "
                                        "can be freed")
            scope.gone[key] = self.index
            scope.allocated.pop(name, None)

    def sizes(self, f: Fields, op: str, args: dict[str, object], runs: tuple[str, ...]) -> None:
        """World buffers grow to their largest use; ranges of allocated buffers are checked
        now, those of world buffers once every step is read."""
        if op == "copy_to_host":
            name = str(args["dst"])
            pages = max(self.scopes[v].lease_pages.get(str(args["src"]), 1) for v in runs)
            if all(name not in self.scopes[v].allocated for v in runs):
                self.world_pages[name] = max(self.world_pages.get(name, 0), pages)
            return
        if op != "host_fill":
            return
        name = str(args["buffer"])
        allocated = [self.scopes[v].allocated[name] for v in runs
                     if name in self.scopes[v].allocated]
        if not allocated:
            self.world_pages[name] = max(self.world_pages.get(name, 0),
                                         int(args.get("pages", 1)))  # type: ignore[arg-type]
        elif "pages" in args:
            raise self.reader.error(f.keys["pages"], f.sub("pages"), f"buffer {name!r} comes "
                                    "from host_alloc, which sets its size; use `page` to fill "
                                    "some of its pages")
        for key in ("page", "offset"):
            if key not in args:
                continue
            value = args[key]
            if key == "page":
                pages = value if isinstance(value, tuple) else (value,)
                need = _Range(f.values[key], f.sub(key), name, max(pages) + 1, 0)  # type: ignore
            else:
                length = int(args.get("length", 1))  # type: ignore[arg-type]
                need = _Range(f.values[key], f.sub(key), name, 0,
                              int(value) + length)  # type: ignore[arg-type]
            for size in allocated:
                self.check_range(need, size)
            if not allocated:
                self.ranges.append(need)
        if "length" in args and "offset" not in args:
            raise self.reader.error(f.keys["length"], f.sub("length"),
                                    "`length` goes with `offset` (a byte range); add offset")

    def check_world_ranges(self) -> None:
        for need in self.ranges:
            self.check_range(need, self.world_pages.get(need.buffer, 1))

    def check_range(self, need: _Range, pages: int) -> None:
        nbytes = pages * self.page_bytes
        if need.page_end > pages:
            raise self.reader.error(need.node, need.path, f"page {need.page_end - 1} is "
                                    f"outside buffer {need.buffer!r}, which has {pages} "
                                    f"page{'s' if pages != 1 else ''} (0..{pages - 1})")
        if need.byte_end > nbytes:
            raise self.reader.error(need.node, need.path, f"bytes up to {need.byte_end} are "
                                    f"outside buffer {need.buffer!r}, which has {nbytes} "
                                    f"bytes ({pages} page{'s' if pages != 1 else ''} of "
                                    f"{self.page_bytes})")

    # ---- messages ------------------------------------------------------------------------------
    def _at(self, index: int) -> str:
        w = self.where[index]
        return f"{w.file}:{w.line}:{w.column}"

    def _op_at(self, index: int) -> str:
        return _raw_scalars(self.nodes[index]).get("op", "?")

    def defined_later(self, kind: str, name: str) -> int | None:
        """The index of a later step that would define ``name``, read leniently from the raw
        nodes: it only shapes the message of an error already found."""
        for later in range(self.index + 1, len(self.nodes)):
            raw = _raw_scalars(self.nodes[later])
            op = raw.get("op")
            if op not in V.OPS:
                continue
            args = {k: v for k, v in raw.items() if k in V.OPS[op].keys}
            if (kind, name) in V.defines(op, raw.get("id"), args):
                return later
        return None


def unknown_stream(name: str, streams: Sequence[str], declared: bool) -> str:
    """What to say of a stream name a scenario does not have."""
    if declared:
        return (f"unknown stream {name!r}{suggest(name, streams)}; the declared streams are "
                f"{', '.join(streams)}: use one, or declare it under spec.streams")
    known = [*streams, *STREAM_ALIASES]
    return (f"unknown stream {name!r}{suggest(name, known)}; use {', '.join(streams)} (or "
            "kvcore's names for them, stream, transfer_stream and legacy_stream), or declare "
            "the scenario's own streams under spec.streams")


def _raw_scalars(node: Node) -> dict[str, str]:
    if not isinstance(node, MappingNode):
        return {}
    return {k.value: v.value for k, v in node.value
            if isinstance(k, ScalarNode) and isinstance(v, ScalarNode)}

