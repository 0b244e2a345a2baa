"""The step list of a scenario: parsed top to bottom and checked once per variant.

A step may run in some variants only (``only: fixed``, ``unless: [buggy]``), so what a name
refers to depends on the variant: a lease that a buggy-only step made does not exist in the
fixed variant. The parser keeps one scope per variant and checks every reference in each
variant the step runs in, so a reference that is valid in one variant and not in another is an
error naming both steps, each at its file:line:col. Names that are given back (a released
lease, a freed pinned buffer) may not be used or given back again.

Each variant's steps are also followed as kvcore would see them, so that the loader refuses
what kvcore would, first, at the step (:mod:`harness.lang.capacity`: the pool's pages, the
table's rows, host buffers' sizes), and as CUDA would capture them
(:mod:`harness.lang.graphs`).
"""

from __future__ import annotations

from collections.abc import Sequence

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness import limits as L
from harness.lang import vocabulary as V
from harness.lang.capacity import Capacity
from harness.lang.footprint import Footprint
from harness.inputs import echo
from harness.lang.graphs import GraphCaptures
from harness.lang.model import STREAM_ALIASES, StreamSpec, Step
from harness.lang.scope import Scope, Sites
from harness.lang.yamlnodes import Fields, Reader, suggest

_PLURAL = {"lease": "leases", "catalog": "catalogs", "buffer": "buffers", "event": "events",
           "graph": "graphs"}


class StepList:
    """Parses ``spec.steps`` (see the module docstring)."""

    def __init__(self, reader: Reader, variants: Sequence[str], streams: Sequence[StreamSpec],
                 declared: bool, world: Footprint, *, allocator: str = "fenced") -> None:
        self.reader = reader
        self.allocator = allocator
        self.variants = tuple(variants)
        self.streams = {s.name: s for s in streams}
        self.declared = declared
        self.page_bytes = world.page_bytes
        self.scopes = {v: Scope() for v in self.variants}
        self.sites = Sites(self.variants)
        self.capacity = Capacity(reader, world, self.scopes, self.sites)
        self.captures = GraphCaptures(reader, self.streams, self.sites)
        self.nodes: list[Node] = []
        self.runs_everywhere: list[bool] = []
        self.index = 0

    # ---- the list ------------------------------------------------------------------------------
    def parse(self, node: Node, path: str) -> tuple[Step, ...]:
        self.nodes = self.reader.sequence(node, path, "a non-empty list of steps",
                                          limit=L.STEPS_MAX, what="steps")
        steps = tuple(self.step(n, f"{path}[{i}]", i) for i, n in enumerate(self.nodes))
        for v in self.variants:
            self.end_section(v, self.nodes[-1], f"{path}[{len(self.nodes) - 1}]", "the last step")
        self.captures.all_ended(self.nodes, path)
        self.capacity.check_world_needs()
        return steps

    def step(self, node: Node, path: str, index: int) -> Step:
        reader = self.reader
        self.index = index
        f = reader.fields(node, path, "a step (a mapping with an op)")
        self.sites.where.append(reader.where(node, path))
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
        self.captures.step(f, op, step_id, args, thread, runs, index)
        self.effects(f, op, step_id, args, runs)
        only = None if len(runs) == len(self.variants) else frozenset(runs)
        return Step(op=op, args=args, id=step_id, index=index, where=self.sites.where[index],
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
                                    f"({self.sites.at(other)}) has it too; {remedy}")
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
                        f"{self.sites.within(v)}; name less of it, or materialize more pages"))
            else:
                self.capacity.need_pages(node, path, v, name, end,
                                         f"a kernel touches {what} of it")
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
                                        f"(steps[{made}], {self.sites.at(made)}, made it); free it "
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
                f"{self.sites.at(made)}, makes it) but not in variant {', '.join(missing)}, where "
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
                                    f"({self.sites.at(gone)}) {verb} it already{where}; remove one "
                                    f"{op} step")
        raise self.reader.error(node, path, f"{kind} {name!r} was {verb} at steps[{gone}] "
                                f"({self.sites.at(gone)}){where}; it cannot be used after that: "
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
                    f"steps[{since}], {self.sites.at(since)}){self.sites.within(v)}: that "
                    "waits forever; unlock it first"))
            if op == "unlock" and since is None:
                raise self.reader.error(node, path, (
                    f"thread {thread!r} unlocks mutex {mutex!r}, which it does not hold"
                    f"{self.sites.within(v)}; lock it first, on the same thread"))
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
            f"{self.sites.at(since)}) when its threads end at {what}{self.sites.within(v)}; "
            "unlock it on that thread before"))

    # ---- what a step makes and gives back --------------------------------------------------------
    def effects(self, f: Fields, op: str, step_id: str | None, args: dict[str, object],
                runs: tuple[str, ...]) -> None:
        index = self.index
        if op == "kernel":
            self.kernel(f, args)
        elif op == "record_stream" or (op == "materialize" and "stream" in args):
            self.caching(f, op)
        for v in runs:
            self.capacity.resources(f, op, step_id, args, v, index)
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
            self.capacity.sizes(f, op, args, v)
        self.capacity.check_now()

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
                                        f"(steps[{made}], {self.sites.at(made)}, made it with "
                                        f"{self._op_at(made)}); only buffers from host_alloc "
                                        "can be freed")
            scope.gone[key] = self.index
            scope.allocated.pop(name, None)

    # ---- messages ------------------------------------------------------------------------------
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

