"""The step list of a scenario: parsed top to bottom and checked once per variant.

A step may run in some variants only (``only: fixed``, ``unless: [buggy]``), so what a name
refers to depends on the variant: a lease that a buggy-only step made does not exist in the
fixed variant. The parser keeps one scope per variant and checks every reference in each
variant the step runs in, so a reference that is valid in one variant and not in another is an
error naming both steps, each at its file:line:col. Names that are given back (a released
lease, a freed pinned buffer) may not be used or given back again.

Each variant's scope also follows what kvcore would refuse when the steps run, so that the
loader refuses it first, at the step (a worker never dies on it): pages leased at once against
the pool's pages, table rows bound against the table's rows, pages a catalog publishes or a
reader reads against a row's entries, a catalog published with a page it no longer leases, a
copy or a check that overruns a host buffer, host buffers past the world's byte limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness import limits as L
from harness.lang import vocabulary as V
from harness.lang.footprint import Footprint
from harness.inputs import echo
from harness.lang.model import STREAM_ALIASES, Location, StreamSpec, Step
from harness.lang.yamlnodes import Fields, Reader, suggest
from kvcore.device.kernels import TABLE_ENTRY_BYTES

_PLURAL = {"lease": "leases", "catalog": "catalogs", "buffer": "buffers", "event": "events",
           "graph": "graphs"}


@dataclass
class _Catalog:
    """A catalog as one variant's steps leave it: the leases it retains (-> the step that
    retained it), its pages, and the table rows bound to it."""

    leases: dict[str, int] = field(default_factory=dict)
    pages: int = 0
    binds: list[int] = field(default_factory=list)  # the bind steps of its rows

    @property
    def rows(self) -> int:
        return len(self.binds)


@dataclass
class _Capture:
    """A graph's capture as one variant's steps leave it: the graph, the stream it is captured
    from and its graph_capture step; per stream capturing (the capture stream and those that
    forked in) its steps so far and how many were joined back; per event recorded inside it,
    the stream and that stream's steps then."""

    name: str
    stream: str
    began: int
    streams: dict[str, int] = field(default_factory=dict)
    back: dict[str, int] = field(default_factory=dict)
    events: dict[str, tuple[str, int]] = field(default_factory=dict)


@dataclass
class _Scope:
    """What one variant has seen so far, step by step."""

    ids: dict[str, int] = field(default_factory=dict)
    names: dict[tuple[str, str], int] = field(default_factory=dict)  # -> defining step
    gone: dict[tuple[str, str], int] = field(default_factory=dict)   # -> step that gave it back
    allocated: dict[str, int] = field(default_factory=dict)  # host_alloc'd buffer -> pages
    lease_pages: dict[str, int] = field(default_factory=dict)
    world: dict[str, int] = field(default_factory=dict)  # world buffer -> pages (largest use)
    alloc_pages: int = 0  # pages of every host_alloc (the executor sizes its arena for all)
    leased: int = 0  # pool pages leased now
    rows: list[int] = field(default_factory=list)  # the steps that bound each table row
    catalogs: dict[str, _Catalog] = field(default_factory=dict)
    counted: int = 0  # read_table and attention steps that count instead of asserting
    bytes: set[int] = field(default_factory=set)  # byte values steps write or expect
    held: dict[tuple[str, str], int] = field(default_factory=dict)  # (thread, mutex) -> lock
    page_lists: dict[str, int] = field(default_factory=dict)  # buffer -> entries last written
    capturing: _Capture | None = None  # the graph being captured
    graphs: dict[str, int] = field(default_factory=dict)  # ended graph -> its graph_end step

    def host_pages(self) -> int:
        return sum(self.world.values()) + self.alloc_pages


@dataclass
class _Need:
    """What a step needs of a world buffer in one variant, checked once every step is read (a
    world buffer is as large as its largest use in the variant): pages, bytes, or as many pages
    as another world buffer has (``like``)."""

    node: Node
    path: str
    variant: str
    buffer: str
    page_end: int = 0  # pages the step needs the buffer to have
    byte_end: int = 0  # bytes likewise
    like: str | None = None  # a buffer whose pages this one must have at least
    why: str = ""  # what the step does with them, for the message
    pages: int = 0  # what the buffer has, once known
    fixed: bool = False  # ``pages`` is a host_alloc'd buffer's, known when the step was read


class StepList:
    """Parses ``spec.steps`` (see the module docstring)."""

    def __init__(self, reader: Reader, variants: Sequence[str], streams: Sequence[StreamSpec],
                 declared: bool, world: Footprint, *, allocator: str = "fenced") -> None:
        self.reader = reader
        self.allocator = allocator
        self.variants = tuple(variants)
        self.streams = {s.name: s for s in streams}
        self.declared = declared
        self.world = world
        self.page_bytes = world.page_bytes
        self.host_budget = world.host_pages(L.WORLD_MAX_BYTES)  # pages of host buffers
        self.scopes = {v: _Scope() for v in self.variants}
        self.nodes: list[Node] = []
        self.where: list[Location] = []
        self.runs_everywhere: list[bool] = []
        self.index = 0
        self.needs: list[_Need] = []  # on world buffers: checked once every step is read
        self.now: list[_Need] = []  # on allocated buffers: checked once the step is read

    # ---- the list ------------------------------------------------------------------------------
    def parse(self, node: Node, path: str) -> tuple[Step, ...]:
        self.nodes = self.reader.sequence(node, path, "a non-empty list of steps",
                                          limit=L.STEPS_MAX, what="steps")
        steps = tuple(self.step(n, f"{path}[{i}]", i) for i, n in enumerate(self.nodes))
        for v in self.variants:
            self.end_section(v, self.nodes[-1], f"{path}[{len(self.nodes) - 1}]", "the last step")
        open_in = [v for v in self.variants if self.scopes[v].capturing is not None]
        if open_in:
            left = self.scopes[open_in[0]].capturing
            assert left is not None
            name, began = left.name, left.began
            within = "" if len(open_in) == len(self.variants) else self._within(open_in[0])
            raise self.reader.error(self.nodes[began], f"{path}[{began}]", (
                f"graph {name!r} is captured here and never ended{within}: add a graph_end "
                f"step (graph: {name}) after the steps it captures"))
        self.check_world_needs()
        return steps

    def step(self, node: Node, path: str, index: int) -> Step:
        reader = self.reader
        self.index = index
        f = reader.fields(node, path, "a step (a mapping with an op)")
        self.where.append(reader.where(node, path))
        if "op" not in f:
            raise reader.error(node, path, f"a step needs an op; use one of {', '.join(V.OPS)}")
        said = reader.value(f.values["op"], f.sub("op"))
        if isinstance(said, str) and said in V.NOT_OPS:
            raise reader.error(f.values["op"], f.sub("op"), f"unknown op {said!r}: "
                               f"{V.NOT_OPS[said]}")
        op = reader.choice(f.values["op"], f.sub("op"), V.OPS, "op")
        spec = V.OPS[op]
        for key in f.values:
            if (op, key) in V.KEY_ELSEWHERE and key not in spec.keys:
                raise reader.error(f.keys[key], f.sub(key), f"{op} takes no {key}: "
                                   f"{V.KEY_ELSEWHERE[op, key]}")
        reader.allow(f, (*V.STEP_KEYS, *spec.keys), f" for op {op}")
        reader.require(f, spec.required(), f"a {op} step")
        runs = self.variants_of(f)
        self.runs_everywhere.append(len(runs) == len(self.variants))
        step_id = self.step_id(f, index, runs) if "id" in f else None
        if step_id is None and spec.id_defines:
            raise reader.error(node, path, f"a {op} step needs an id: it names the "
                               f"{spec.id_defines} later steps refer to")
        self.choices(f, spec)
        args = {key: self.arg(op, key, value, f.sub(key), runs)
                for key, value in f.values.items() if key not in V.STEP_KEYS}
        thread = reader.name(f.values[V.THREAD_KEY], f.sub(V.THREAD_KEY)) \
            if V.THREAD_KEY in f else None
        self.threads(f, op, args, thread, runs)
        self.graphs(f, op, step_id, args, thread, runs)
        self.effects(f, op, step_id, args, runs)
        only = None if len(runs) == len(self.variants) else frozenset(runs)
        return Step(op=op, args=args, id=step_id, index=index, where=self.where[index],
                    only=only, thread=thread)

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
        named = []
        for item, item_path in self.reader.one_or_list(node, path,
                                                       "a variant name or a list of them"):
            name = self.reader.string(item, item_path)
            if name not in self.variants:
                raise self.reader.error(item, item_path, f"unknown variant {echo(name)}"
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
        # Counts and offsets of bytes go up to the world's bytes; of pages, to the pool's.
        in_bytes = key in ("offset", "length")
        limit = L.WORLD_MAX_BYTES if in_bytes else L.POOL_MAX_PAGES
        what = "bytes of a world (1 GiB)" if in_bytes else "pages of a pool"
        if holds == V.STREAM:
            return self.stream(node, path)
        if holds == V.COUNT:
            return reader.integer(node, path, 1, limit=limit, what=what)
        if holds == V.INDEX:
            return reader.integer(node, path, 0, limit=limit, what=what)
        if holds == V.PAGES:
            if isinstance(node, SequenceNode):
                items = reader.sequence(node, path, "a page number or a list of them",
                                        limit=L.POOL_MAX_PAGES, what="pages")
                return tuple(reader.integer(n, f"{path}[{i}]", 0, limit=limit, what=what)
                             for i, n in enumerate(items))
            return reader.integer(node, path, 0, limit=limit, what=what)
        if holds == V.BYTE:
            return reader.integer(node, path, 0, 255)
        if holds in (V.DURATION, V.MICROS):  # a kernel's .inf is refused with its remedy
            # .inf is a kernel that never ends: how a scenario provokes a hang on purpose.
            return reader.number(node, path, "a positive number of microseconds (or .inf)",
                                 positive=True, infinite=True, limit=L.DELAY_MAX_US,
                                 what="microseconds of a delay (10 s; .inf never ends)")
        if holds == V.BOOL:
            return reader.boolean(node, path)
        if holds == V.MUTEX:
            return reader.name(node, path)
        if holds in (V.NEW_BUFFER, V.NEW_EVENT):
            name = reader.name(node, path)
            if holds == V.NEW_BUFFER:
                for v in runs:
                    self.not_gone(("buffer", name), v, node, path)
            return name
        if holds == V.ALLOC_BUFFER:
            return self.new_allocation(node, path, runs)
        if holds == V.LIST:
            return self.memory(node, path, runs)
        if holds == V.MEMORY:
            items = [(node, path)] if not isinstance(node, SequenceNode) else [
                (n, f"{path}[{i}]") for i, n in enumerate(reader.sequence(
                    node, path, "a lease or pinned buffer, or a list of them",
                    limit=L.KERNEL_MEMORY_MAX, what="leases and buffers of one kernel"))]
            return tuple(self.part(n, p, runs) if isinstance(n, MappingNode)
                         else self.memory(n, p, runs) for n, p in items)
        if holds == V.EVENTS and isinstance(node, SequenceNode):
            items = reader.sequence(node, path, "an event or a list of events")
            return tuple(self.reference("event", n, f"{path}[{i}]", runs)
                         for i, n in enumerate(items))
        return self.reference(V.REFERENCES[holds], node, path, runs)

    def memory(self, node: Node, path: str, runs: tuple[str, ...]) -> str:
        """A lease or a pinned buffer an earlier step made (a kernel's reads or writes): the
        name's kind is whichever it is in every variant the step runs in."""
        name = self.reader.string(node, path)
        kinds = [k for k in V.MEMORY_KINDS if any((k, name) in self.scopes[v].names
                                                  for v in runs)]
        if len(kinds) > 1:
            raise self.reader.error(node, path, f"{name!r} names a lease and a pinned buffer "
                                    "both; rename one, so a kernel's memory is one thing")
        if kinds:
            return self.reference(kinds[0], node, path, runs)
        known = sorted({n for v in runs for (k, n) in self.scopes[v].names
                        if k in V.MEMORY_KINDS})
        raise self.reader.error(node, path, (
            f"unknown lease or buffer {echo(name)}{suggest(name, known)}; leases and buffers "
            f"defined so far: {', '.join(known[:20])}" if known else
            f"unknown lease or buffer {echo(name)}; none is defined before this step "
            f"({V.HOW_TO_DEFINE['lease']}; {V.HOW_TO_DEFINE['buffer']})"))

    def part(self, node: Node, path: str, runs: tuple[str, ...]) -> dict[str, object]:
        """Some of a lease or pinned buffer a kernel touches: pages of it (``page``), or bytes
        from the start of its first page (``offset``, ``length``), its pages one after another;
        checked against the lease's pages here, against a world buffer's once every step is
        read."""
        reader = self.reader
        f = reader.fields(node, path, "a part of a lease or pinned buffer ({lease: kv, page: 1} "
                          "or {buffer: b, offset: 0, length: 64})")
        reader.allow(f, ("lease", "buffer", "page", "offset", "length"), " for a part")
        kinds = [k for k in V.MEMORY_KINDS if k in f]
        if len(kinds) != 1:
            raise reader.error(node, path, "a part names one lease or one pinned buffer "
                               f"(`lease:` or `buffer:`); it has {'both' if kinds else 'neither'}")
        kind = kinds[0]
        name = self.reference(kind, f.values[kind], f.sub(kind), runs)
        if ("page" in f) == ("offset" in f) or ("length" in f) != ("offset" in f):
            raise reader.error(node, path, "a part is some pages (`page:` a number or a list) "
                               "or a byte range (`offset:` and `length:`), one of them")
        out: dict[str, object] = {kind: name}
        if "page" in f:
            out["page"] = self.arg("host_fill", "page", f.values["page"], f.sub("page"), runs)
            pages = out["page"] if isinstance(out["page"], tuple) else (out["page"],)
            end, what = max(pages) + 1, f"page {max(pages)}"  # type: ignore[type-var]
        else:
            offset = reader.integer(f.values["offset"], f.sub("offset"), 0,
                                    limit=L.WORLD_MAX_BYTES, what="bytes of a world (1 GiB)")
            length = reader.integer(f.values["length"], f.sub("length"), 1,
                                    limit=L.WORLD_MAX_BYTES, what="bytes of a world (1 GiB)")
            out.update(offset=offset, length=length)
            end, what = -(-(offset + length) // self.page_bytes), f"bytes up to {offset + length}"
        for v in runs:
            if kind == "lease":
                have = self.scopes[v].lease_pages[name]
                if end > have:
                    raise reader.error(node, path, (
                        f"{what} is outside lease {name!r}, which has {have} "
                        f"page{'s' if have != 1 else ''} of {self.page_bytes} bytes"
                        f"{self._within(v)}; name less of it, or materialize more pages"))
            else:
                self.need_pages(node, path, v, name, end, f"a kernel touches {what} of it")
        return out

    def stream(self, node: Node, path: str) -> str:
        if self.reader.value(node, path) is None:  # `stream: null` (or ~, or nothing)
            legacy = [name for name, spec in self.streams.items() if spec.kind == "legacy"]
            where = f"is {legacy[0]!r} here" if legacy else (
                "is a stream of kind legacy: declare one under spec.streams (e.g. `default: "
                "legacy`) and name it")
            raise self.reader.error(node, path, "YAML reads this as nothing (null), not a "
                                    "name; CUDA's null stream, the legacy default stream, "
                                    f"{where} (to name a stream 'null', quote it)")
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
        other = [k for k in _PLURAL if k != kind and any(
            (k, name) in self.scopes[v].names for v in runs)]
        if other:  # a buffer where a lease goes, say: the op that takes it is another
            op, key = self._op_at(self.index), path.rsplit(".", 1)[-1]
            instead = V.OTHER_OP.get((op, key, other[0]), f"give a {kind} here")
            raise self.reader.error(node, path, f"{name!r} is a {other[0]}, not a {kind}: "
                                    f"{instead}")
        later = self.defined_later(kind, name)
        verb = "recorded" if kind == "event" else "defined"
        known = sorted({n for v in runs for (k, n) in self.scopes[v].names if k == kind})
        if later is not None:
            message = (f"unknown {kind} {echo(name)}: steps[{later}] defines it, after this "
                       "step; move that step before this one")
        elif known:
            shown = ", ".join(known[:20]) + (f" and {len(known) - 20} more"
                                             if len(known) > 20 else "")
            message = (f"unknown {kind} {echo(name)}{suggest(name, known)}; {_PLURAL[kind]} "
                       f"{verb} so far: {shown}")
        else:
            message = (f"unknown {kind} {echo(name)}; none is {verb} before this step "
                       f"({V.HOW_TO_DEFINE[kind]})")
        raise self.reader.error(node, path, message)

    def not_gone(self, key: tuple[str, str], variant: str, node: Node, path: str) -> None:
        scope = self.scopes[variant]
        gone = scope.gone.get(key)
        if gone is None:
            return
        kind, name = key
        verb, remedy = {
            "lease": ("released", "materialize pages again"),
            "catalog": ("released", "make a new catalog"),
        }.get(kind, ("freed", "allocate it again with host_alloc"))
        where = "" if self.runs_everywhere[gone] else f" in variant {variant}"
        op = self._op_at(self.index)
        if V.OPS[op].frees == (path.rsplit(".", 1)[-1], kind):
            raise self.reader.error(node, path, f"{kind} {name!r} is {verb} twice: steps[{gone}] "
                                    f"({self._at(gone)}) {verb} it already{where}; remove one "
                                    f"{op} step")
        raise self.reader.error(node, path, f"{kind} {name!r} was {verb} at steps[{gone}] "
                                f"({self._at(gone)}){where}; it cannot be used after that: "
                                f"{remedy}")

    # ---- host threads --------------------------------------------------------------------------
    def threads(self, f: Fields, op: str, args: dict[str, object], thread: str | None,
                runs: tuple[str, ...]) -> None:
        """Mutexes are taken and given back by the same thread, never twice, and none is held
        when its parallel section ends (the steps after it would wait for a thread that waits
        for nobody)."""
        if thread is None:
            for v in runs:
                self.end_section(v, f.node, f.path, "this step")
        if op not in ("lock", "unlock"):
            return
        node, path = f.values["mutex"], f.sub("mutex")
        mutex = str(args["mutex"])
        if thread is None:
            raise self.reader.error(f.node, f.path, f"{op} is for host threads: give this step "
                                    "a `thread:` (the thread that takes the mutex)")
        for v in runs:
            held = self.scopes[v].held
            since = held.get((thread, mutex))
            if op == "lock" and since is not None:
                raise self.reader.error(node, path, (
                    f"thread {thread!r} locks mutex {mutex!r} again while it holds it (since "
                    f"steps[{since}], {self._at(since)}){self._within(v)}: that waits forever; "
                    "unlock it first"))
            if op == "unlock" and since is None:
                raise self.reader.error(node, path, (
                    f"thread {thread!r} unlocks mutex {mutex!r}, which it does not hold"
                    f"{self._within(v)}; lock it first, on the same thread"))
            if op == "lock":
                held[(thread, mutex)] = self.index
            else:
                del held[(thread, mutex)]

    def end_section(self, v: str, node: Node, path: str, what: str) -> None:
        """The parallel section of variant ``v`` ends at ``what``: no mutex may stay held."""
        scope = self.scopes[v]
        if not scope.held:
            return
        (thread, mutex), since = next(iter(scope.held.items()))
        raise self.reader.error(node, path, (
            f"thread {thread!r} still holds mutex {mutex!r} (locked at steps[{since}], "
            f"{self._at(since)}) when its threads end at {what}{self._within(v)}; unlock it "
            "on that thread before"))

    # ---- CUDA graphs -----------------------------------------------------------------------------
    def graphs(self, f: Fields, op: str, step_id: str | None, args: dict[str, object],
               thread: str | None, runs: tuple[str, ...]) -> None:
        """A graph is captured from one stream of the scenario's own, by the capturable steps
        between its graph_capture and its graph_end on the streams capturing (that stream, and
        those that forked in by waiting for an event recorded in the capture), on the
        scenario's thread; each forked stream joins back before the graph_end (a replay inside
        the capture, before the graph is ended, is refused as a nested graph)."""
        for v in runs:
            capture = self.scopes[v].capturing
            if capture is not None and op != "graph_end":
                self.captured(f, op, args, thread, capture, self._within(v))
            if op == "graph_capture":
                self.capture_begins(f, step_id, args, thread, v)
            elif op == "graph_end":
                self.capture_ends(f, args, v)

    def captured(self, f: Fields, op: str, args: dict[str, object], thread: str | None,
                 capture: _Capture, within: str) -> None:
        """A step inside a capture: one a graph holds, on a stream capturing (or a wait that
        forks one in), on the scenario's thread."""
        reader = self.reader
        since = (f"graph {capture.name!r} is being captured (steps[{capture.began}], "
                 f"{self._at(capture.began)}){within}")
        if op not in V.CAPTURABLE:
            raise reader.error(f.values["op"], f.sub("op"), f"{op} cannot stand inside a "
                               f"graph's capture ({since}): {V.NOT_CAPTURED[op]}")
        if thread is not None:
            raise reader.error(f.values[V.THREAD_KEY], f.sub(V.THREAD_KEY), (
                f"{since} on the scenario's own thread; a step of thread {thread!r} cannot "
                "join it: capture from one thread"))
        stream = str(args["stream"])
        if op == "wait_event":
            event = str(args["event"])
            if event not in capture.events:
                raise reader.error(f.values["event"], f.sub("event"), (
                    f"event {event!r} was recorded outside the capture ({since}): CUDA "
                    "refuses a captured wait for it (cudaErrorStreamCaptureIsolation); wait on "
                    "the replaying stream before graph_replay, or record the event inside"))
            on, steps = capture.events[event]
            capture.streams.setdefault(stream, 0)  # a fork, when the stream was not capturing
            if stream == capture.stream and on != capture.stream:
                capture.back[on] = steps  # a join of what `on` did until its record
        elif stream not in capture.streams:
            forked = ", ".join(s for s in capture.streams if s != capture.stream)
            raise reader.error(f.values["stream"], f.sub("stream"), (
                f"{since} from stream {capture.stream!r}"
                + (f" (and {forked}, forked in)" if forked else "")
                + f"; this step on {stream!r} would run now, outside the graph: give it a "
                "capturing stream, fork it in (wait_event on it for an event recorded in the "
                "capture), or move it before graph_capture or after graph_end"))
        elif op == "record_event":
            capture.events[str(args["event"])] = (stream, capture.streams[stream])
        else:
            capture.streams[stream] += 1

    def capture_begins(self, f: Fields, step_id: str | None, args: dict[str, object],
                       thread: str | None, v: str) -> None:
        reader = self.reader
        stream = str(args["stream"])
        if self.streams[stream].kind == "legacy":
            raise reader.error(f.values["stream"], f.sub("stream"), (
                f"{stream!r} is the legacy default stream, which CUDA cannot capture "
                "(cudaErrorStreamCaptureUnsupported; PyTorch: \"CUDA graphs must be captured "
                "on a non-default stream\"); capture on a stream of your own"))
        if thread is not None:
            raise reader.error(f.values[V.THREAD_KEY], f.sub(V.THREAD_KEY),
                               "a graph is captured on the scenario's own thread; remove the "
                               "thread")
        self.scopes[v].capturing = _Capture(str(step_id), stream, self.index, streams={stream: 0})

    def capture_ends(self, f: Fields, args: dict[str, object], v: str) -> None:
        reader, scope, within = self.reader, self.scopes[v], self._within(v)
        name = str(args["graph"])
        node, path = f.values["graph"], f.sub("graph")
        capture = scope.capturing
        if name in scope.graphs:
            ended = scope.graphs[name]
            raise reader.error(node, path, f"graph {name!r} was ended at steps[{ended}] "
                               f"({self._at(ended)}){within}; remove one graph_end")
        if capture is None or capture.name != name:
            raise reader.error(node, path, f"graph {name!r} is not being captured here{within}: "
                               "graph_end ends the graph_capture before it"
                               + (f" (now {capture.name!r})" if capture else ""))
        if not any(capture.streams.values()):
            raise reader.error(node, path, (
                f"graph {name!r} captures nothing{within}: put the stream ops it replays (on "
                f"{capture.stream!r}) between its graph_capture and this graph_end"))
        for stream, steps in capture.streams.items():
            if stream != capture.stream and capture.back.get(stream, 0) < steps:
                raise reader.error(node, path, (
                    f"stream {stream!r} forked into graph {name!r}'s capture and is not joined "
                    f"back{within} (CUDA: cudaErrorStreamCaptureUnjoined): record an event on "
                    f"{stream!r} after its last step in the capture, and make "
                    f"{capture.stream!r} wait on it before this graph_end"))
        scope.capturing = None
        scope.graphs[name] = self.index

    # ---- what a step makes and gives back --------------------------------------------------------
    def effects(self, f: Fields, op: str, step_id: str | None, args: dict[str, object],
                runs: tuple[str, ...]) -> None:
        index = self.index
        if op == "kernel":
            self.kernel(f, args)
        elif op == "record_stream" or (op == "materialize" and "stream" in args):
            self.caching(f, op)
        for v in runs:
            self.resources(f, op, step_id, args, v)
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
        for v in runs:
            self.sizes(f, op, args, v)
        self.check_needs(self.now)
        self.now = []

    def kernel(self, f: Fields, args: dict[str, object]) -> None:
        """A kernel step: it reads or writes something, writes a byte (or what it read) where
        it writes, and ends (a kernel that never does is `delay: .inf`)."""
        if "reads" not in args and "writes" not in args:
            raise self.reader.error(f.node, f.path, "a kernel step reads or writes something: "
                                    "give reads, writes or both (leases, pinned buffers)")
        if "byte" in args and "writes" not in args:
            raise self.reader.error(f.keys["byte"], f.sub("byte"), "a kernel writes its byte "
                                    "over what it writes: give writes too, or no byte")
        if "writes" in args and "byte" not in args and "reads" not in args:
            raise self.reader.error(f.keys["writes"], f.sub("writes"), "a kernel writes its "
                                    "byte, or the first byte it read: give byte, or reads")
        us = args.get("us", 0.0)
        if us == float("inf"):
            raise self.reader.error(f.values["us"], f.sub("us"), "a kernel runs for a while and "
                                    "ends; one that never ends is a `delay` step with `us: .inf`")

    def caching(self, f: Fields, op: str) -> None:
        """record_stream and a lease's stream are a caching allocator's."""
        if self.allocator == "caching":
            return
        node, path = (f.values["op"], f.sub("op")) if op == "record_stream" else \
            (f.keys["stream"], f.sub("stream"))
        what = "record_stream" if op == "record_stream" else "a lease's stream"
        raise self.reader.error(node, path, f"{what} is the caching allocator's: add "
                                "`allocator: caching` to spec.pool (the default pool, "
                                "`fenced`, waits at release for every stream that used a "
                                "page, and its pages belong to no stream)")

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

    def resources(self, f: Fields, op: str, step_id: str | None, args: dict[str, object],
                  v: str) -> None:
        """What kvcore would refuse when this step runs in variant ``v`` (module docstring),
        checked against the variant's state before the step, which is then brought up to
        date."""
        scope = self.scopes[v]
        within = self._within(v)
        if op == "materialize":
            pages = int(args["pages"])  # type: ignore[arg-type]
            if scope.leased + pages > self.world.pages:
                raise self.reader.error(f.values["pages"], f.sub("pages"), (
                    f"{pages} more page{'s' if pages != 1 else ''} while {scope.leased} of "
                    f"the pool's {self.world.pages} are leased{within}: the pool would run "
                    "out; release pages first, or raise spec.pool.pages"))
            scope.leased += pages
        elif op == "release":
            scope.leased -= scope.lease_pages[str(args["lease"])]
        elif op == "retain":
            catalog = scope.catalogs[str(args["catalog"])]
            lease = str(args["lease"])
            if lease in catalog.leases:
                first = catalog.leases[lease]
                raise self.reader.error(f.values["lease"], f.sub("lease"), (
                    f"catalog {args['catalog']!r} retains lease {lease!r} already (steps[{first}], "
                    f"{self._at(first)}){within}; a catalog keeps a page once (kvcore would give "
                    "it back twice when the conversation ends): remove this retain"))
            catalog.leases[lease] = self.index
            catalog.pages += scope.lease_pages[lease]
        elif op == "catalog":
            scope.catalogs[str(step_id)] = _Catalog()
        elif op == "bind":
            if len(scope.rows) >= self.world.table_rows:
                rows = self.world.table_rows
                by = ", ".join(f"steps[{i}]" for i in scope.rows[:8])
                raise self.reader.error(f.node, f.path, (
                    f"no table row is left to bind{within}: the table's {rows} "
                    f"row{'s are' if rows != 1 else ' is'} bound already ({by}; "
                    "spec.pool.table_rows), and a catalog bound twice takes two; raise "
                    "table_rows or bind fewer times"))
            scope.rows.append(self.index)
            scope.catalogs[str(args["catalog"])].binds.append(self.index)
        elif op == "release_catalog":
            catalog = scope.catalogs[str(args["catalog"])]
            for lease in catalog.leases:
                gone = scope.gone.get(("lease", lease))
                if gone is not None:
                    raise self.reader.error(f.values["catalog"], f.sub("catalog"), (
                        f"catalog {args['catalog']!r} retains lease {lease!r}, released at "
                        f"steps[{gone}] ({self._at(gone)}){within}: kvcore would release it "
                        "twice; leave the lease to the catalog"))
                scope.gone[("lease", lease)] = self.index
                scope.leased -= scope.lease_pages[lease]
            for bind in catalog.binds:
                scope.rows.remove(bind)
        elif op in ("kv_write", "attention", "gather", "scatter") and "page_list" in args:
            self.list_use(f, op, args, v)
        elif op in ("activate", "publish", "read_table", "kv_write", "attention"):
            self.table_use(f, op, args, v)
        elif op == "page_list":
            entries = scope.lease_pages[str(args["lease"])]
            most = self.page_bytes // TABLE_ENTRY_BYTES
            if entries > most:
                raise self.reader.error(f.values["lease"], f.sub("lease"), (
                    f"lease {args['lease']!r} has {entries} pages; a page list holds at most "
                    f"{most} entries of {TABLE_ENTRY_BYTES} bytes (one page of the buffer): "
                    "list a smaller lease"))
            scope.page_lists[str(args["buffer"])] = entries
        elif op == "read_pinned":
            self.count_slot(f.node, f.path, v)
        elif op in ("copy_from_host", "copy_to_host"):
            lease, buffer = (args["dst"], args["src"]) if op == "copy_from_host" else \
                (args["src"], args["dst"])
            key = "src" if op == "copy_from_host" else "dst"
            pages = scope.lease_pages[str(lease)]
            if op == "copy_from_host":
                # The lease holds what the buffer holds: a page list copied in is a device
                # index kernels can follow; anything else copied over one is not.
                listed = scope.page_lists.get(str(buffer))
                if listed is not None:
                    scope.page_lists[str(lease)] = listed
                else:
                    scope.page_lists.pop(str(lease), None)
            self.need_pages(f.values[key], f.sub(key), v, str(buffer), pages,
                            f"lease {lease!r} has {pages} page{'s' if pages != 1 else ''}, "
                            "all copied")
        elif op == "check" and "equals" in args:
            if "lease" in args:
                pages = scope.lease_pages[str(args["lease"])]
                self.need_pages(f.values["equals"], f.sub("equals"), v, str(args["equals"]),
                                pages, f"lease {args['lease']!r} has {pages} "
                                f"page{'s' if pages != 1 else ''}, all compared")
            else:
                self.need_like(f, v, str(args["equals"]), str(args["buffer"]))
        elif op == "host_alloc":
            pages = int(args.get("pages", 1))  # type: ignore[arg-type]
            scope.alloc_pages += pages
            self.host_budget_left(f.values["buffer"], f.sub("buffer"), v, str(args["buffer"]))
        if "byte" in args:
            scope.bytes.add(int(args["byte"]))  # type: ignore[arg-type]
            if len(scope.bytes - {0}) >= 255:
                # The GPU scrubs pages between trials with a byte no step uses.
                raise self.reader.error(f.values["byte"], f.sub("byte"), (
                    f"steps{within} use every byte value from 1 to 255; leave one unused (the "
                    "GPU fills pages between trials with a byte no step writes or expects)"))

    def table_use(self, f: Fields, op: str, args: dict[str, object], v: str) -> None:
        """An activation publishes a catalog's pages into each row bound to it; a reader reads
        the first row's entries (at least one). kvcore refuses an unbound catalog, more pages
        than a row has entries, a page no longer leased (at a publish), and more counting
        readers than the counter buffer has slots."""
        scope = self.scopes[v]
        name = str(args["catalog"])
        catalog = scope.catalogs[name]
        node, path = f.values["catalog"], f.sub("catalog")
        within = self._within(v)
        if not catalog.rows:
            made = scope.names[("catalog", name)]
            raise self.reader.error(node, path, (
                f"catalog {name!r} (steps[{made}], {self._at(made)}) is bound to no table "
                f"row{within}; bind it first (a bind step before this one)"))
        row = self.world.row_pages
        follows = op in ("read_table", "kv_write", "attention")  # read the row on the device
        entries = max(1, catalog.pages) if follows else catalog.pages
        if entries > row:
            verb = "reads" if follows else "publishes"
            raise self.reader.error(node, path, (
                f"this {op} {verb} {entries} entries of catalog {name!r}{within}, more than a "
                f"table row's {row} (spec.pool.max_pages_per_row, or the pool's pages when "
                "0); raise max_pages_per_row, or retain fewer pages"))
        if not follows:
            for lease in catalog.leases:
                gone = scope.gone.get(("lease", lease))
                if gone is not None:
                    raise self.reader.error(node, path, (
                        f"catalog {name!r} retains lease {lease!r}, released at steps[{gone}] "
                        f"({self._at(gone)}){within}: kvcore refuses to publish a page no "
                        "longer leased; activate before that release, or release the lease "
                        "only when the conversation ends"))
        elif op != "kv_write" and args.get("assert") is False:
            self.count_slot(f.values["assert"], f.sub("assert"), v)

    def list_use(self, f: Fields, op: str, args: dict[str, object], v: str) -> None:
        """A kernel that follows a page list needs one written before it (in the variant); a
        gather or scatter moves as many pages of its pinned buffer as the list has entries."""
        scope = self.scopes[v]
        name = str(args["page_list"])
        entries = scope.page_lists.get(name)
        if entries is None:
            lease = ("lease", name) in scope.names
            raise self.reader.error(f.values["page_list"], f.sub("page_list"), (
                f"lease {name!r} holds no page list{self._within(v)} when this {op} runs: "
                "copy one into it first (copy_from_host of a buffer a page_list step wrote)"
                if lease else
                f"buffer {name!r} holds no page list{self._within(v)} when this {op} runs: "
                "write one into it first (a page_list step)"))
        if op == "attention" and args.get("assert") is False:
            self.count_slot(f.values["assert"], f.sub("assert"), v)
        elif op in ("gather", "scatter"):
            key = "to" if op == "gather" else "from"
            self.need_pages(f.values[key], f.sub(key), v, str(args[key]), entries,
                            f"page list {name!r} has {entries} entr"
                            f"{'ies' if entries != 1 else 'y'}, a page each")

    def count_slot(self, node: Node, path: str, v: str) -> None:
        """A kernel that counts takes one of the executor's counters."""
        scope = self.scopes[v]
        scope.counted += 1
        if scope.counted > L.COUNTED_READS_MAX:
            raise self.reader.error(node, path, (
                f"more than {L.COUNTED_READS_MAX} counting kernels (read_table and attention "
                f"with assert: false, read_pinned){self._within(v)}, the most there are "
                "counters for; let the table readers assert, or read fewer times"))

    # ---- host buffer sizes -----------------------------------------------------------------------
    def sizes(self, f: Fields, op: str, args: dict[str, object], v: str) -> None:
        """World buffers grow to their largest use in the variant (as the executor sizes
        them); ranges of allocated buffers are checked now, those of world buffers once every
        step is read."""
        scope = self.scopes[v]
        if op in ("copy_to_host", "gather", "page_list"):
            # The pages the device writes there (a page list fits in one).
            key, pages = {
                "copy_to_host": ("dst", lambda: scope.lease_pages.get(str(args["src"]), 1)),
                "gather": ("to", lambda: scope.page_lists.get(str(args["page_list"]), 1)),
                "page_list": ("buffer", lambda: 1)}[op]
            name = str(args[key])
            if name not in scope.allocated:
                self.grow(f.values[key], f.sub(key), v, name, pages())
            return
        if op != "host_fill":
            return
        name = str(args["buffer"])
        allocated = scope.allocated.get(name)
        if allocated is None:
            node, path = (f.values["pages"], f.sub("pages")) if "pages" in args else \
                (f.values["buffer"], f.sub("buffer"))
            self.grow(node, path, v, name, int(args.get("pages", 1)))  # type: ignore[arg-type]
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
                need = _Need(f.values[key], f.sub(key), v, name, page_end=max(pages) + 1)
            else:
                length = int(args.get("length", 1))  # type: ignore[arg-type]
                need = _Need(f.values[key], f.sub(key), v, name,
                             byte_end=int(value) + length)  # type: ignore[arg-type]
            if allocated is not None:
                need.pages = allocated
                self.now.append(need)
            else:
                self.needs.append(need)
        if "length" in args and "offset" not in args:
            raise self.reader.error(f.keys["length"], f.sub("length"),
                                    "`length` goes with `offset` (a byte range); add offset")

    def grow(self, node: Node, path: str, v: str, name: str, pages: int) -> None:
        """World buffer ``name`` is at least ``pages`` pages in variant ``v``."""
        scope = self.scopes[v]
        if pages > scope.world.get(name, 0):
            scope.world[name] = pages
            self.host_budget_left(node, path, v, name)

    def host_budget_left(self, node: Node, path: str, v: str, name: str) -> None:
        scope = self.scopes[v]
        if scope.host_pages() > self.host_budget:
            total = scope.host_pages() * self.page_bytes
            raise self.reader.error(node, path, (
                f"with buffer {name!r}, the pinned host buffers{self._within(v)} take "
                f"{total:,} bytes; beside the pool's other allocations "
                f"({self.world.describe()}), the world would take more than "
                f"{L.WORLD_MAX_BYTES:,} bytes (1 GiB), the most it may: use fewer or "
                "smaller buffers"))

    def need_pages(self, node: Node, path: str, v: str, buffer: str, pages: int,
                   why: str) -> None:
        """Buffer ``buffer`` must have ``pages`` pages when this step runs in ``v``."""
        allocated = self.scopes[v].allocated.get(buffer)
        need = _Need(node, path, v, buffer, page_end=pages, why=why)
        if allocated is not None:
            need.pages = allocated
            self.now.append(need)
        else:
            self.needs.append(need)

    def need_like(self, f: Fields, v: str, equals: str, read: str) -> None:
        """A check of buffer ``read`` against buffer ``equals`` compares every page of the
        first: the second must have as many."""
        scope = self.scopes[v]
        pages = scope.allocated.get(read)
        node, path = f.values["equals"], f.sub("equals")
        if pages is None:
            # The buffer read is a world buffer, sized once every step is read; the one it is
            # compared with may be either.
            allocated = scope.allocated.get(equals)
            self.needs.append(_Need(node, path, v, equals, like=read,
                                    why=f"buffer {read!r} is compared page by page",
                                    pages=allocated or 0, fixed=allocated is not None))
        else:
            self.need_pages(node, path, v, equals, pages, f"buffer {read!r} has {pages} "
                            f"page{'s' if pages != 1 else ''}, all compared")

    def check_world_needs(self) -> None:
        for need in self.needs:
            world = self.scopes[need.variant].world
            if need.like is not None:
                need.page_end = world.get(need.like, 1)
                need.why += f" ({need.page_end} page{'s' if need.page_end != 1 else ''})"
            if not need.fixed:
                need.pages = world.get(need.buffer, 1)
        self.check_needs(self.needs)

    def check_needs(self, needs: list[_Need]) -> None:
        """Check needs, grouped by the node that asks (one need per variant the step runs
        in): the message names a variant only when the step fails in some of them."""
        groups: dict[int, list[_Need]] = {}
        for need in needs:
            groups.setdefault(id(need.node), []).append(need)
        for group in groups.values():
            failing = [n for n in group if self.fails(n)]
            if failing:
                self.check_need(failing[0], len(failing) < len(group))

    def fails(self, need: _Need) -> bool:
        return need.page_end > need.pages or need.byte_end > need.pages * self.page_bytes

    def check_need(self, need: _Need, some: bool) -> None:
        """Raise the error of a need that fails; ``some``: it fails in some variants only."""
        pages = need.pages
        nbytes = pages * self.page_bytes
        within = self._within(need.variant) if some else ""
        has = f"{pages} page{'s' if pages != 1 else ''}"
        if need.why and need.page_end > pages:
            raise self.reader.error(need.node, need.path, (
                f"buffer {need.buffer!r} has {has}{within}, but {need.why}: the step would "
                f"overrun it; give the buffer {need.page_end} pages (host_fill pages:, or "
                "host_alloc pages:)"))
        if need.page_end > pages:
            raise self.reader.error(need.node, need.path, f"page {need.page_end - 1} is "
                                    f"outside buffer {need.buffer!r}, which has {has} "
                                    f"(0..{pages - 1}){within}")
        if need.byte_end > nbytes:
            raise self.reader.error(need.node, need.path, f"bytes up to {need.byte_end} are "
                                    f"outside buffer {need.buffer!r}, which has {nbytes} "
                                    f"bytes ({has} of {self.page_bytes}){within}")

    def _within(self, variant: str) -> str:
        """" in variant v" for a message, when the scenario has more than one."""
        return "" if len(self.variants) == 1 else f" in variant {variant}"

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
        return (f"unknown stream {echo(name)}{suggest(name, streams)}; the declared streams are "
                f"{', '.join(streams)}: use one, or declare it under spec.streams")
    known = [*streams, *STREAM_ALIASES]
    return (f"unknown stream {echo(name)}{suggest(name, known)}; use {', '.join(streams)} (or "
            "kvcore's names for them, stream, transfer_stream and legacy_stream), or declare "
            "the scenario's own streams under spec.streams")


def _raw_scalars(node: Node) -> dict[str, str]:
    if not isinstance(node, MappingNode):
        return {}
    return {k.value: v.value for k, v in node.value
            if isinstance(k, ScalarNode) and isinstance(v, ScalarNode)}

