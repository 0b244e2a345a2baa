"""Load scenario and suite files (YAML) into the frozen records of :mod:`harness.lang.model`.

The loader is strict: an unknown key, a wrong type, a duplicate key or a reference to a stream,
lease, catalog, buffer, event, variant or step that does not exist (yet, or in some variant) is
a :class:`~harness.errors.ScenarioError` whose message starts ``file:line:col: path:``, pointing
at the YAML node to fix. The step list is checked per variant by :mod:`harness.lang.steplist`.
"""

from __future__ import annotations

from pathlib import Path

from yaml.nodes import MappingNode, Node, ScalarNode

import kvcore
from harness import limits as L
from harness.errors import ScenarioError, TraceError
from harness.inputs import echo, show_path
from harness.lang.model import (
    DEFAULT_STREAMS,
    STREAM_ALIASES,
    EXPECTATIONS,
    STREAM_KINDS,
    WORKLOAD_PHASES,
    Amplify,
    PlaneSpec,
    PoolSpec,
    Scenario,
    Step,
    StreamSpec,
    Suite,
    Variant,
    Workload,
)
from harness.lang.footprint import Footprint
from harness.lang.steplist import StepList, unknown_stream
from harness.traces.ticket import load_ticket
from harness.lang.yamlnodes import (API_VERSION, NAME_PATTERN, ROOT, Fields, Reader, open_yaml,
                                    suggest)

__all__ = [
    "API_VERSION", "KINDS", "NAME_PATTERN", "WORKLOAD_KINDS", "WORKLOAD_PHASES",
    "load_document", "load_scenario", "load_suite",
]

KINDS = ("Scenario", "Suite")
WORKLOAD_KINDS = ("conversation", "ticket")
DTYPES = tuple(d.label for d in kvcore.DType)
TOP_KEYS = ("apiVersion", "kind", "metadata", "spec")


# --------------------------------------------------------------------------------------------
# Public entry points


def load_scenario(path: str | Path) -> Scenario:
    """Read and check the scenario file ``path``; raise ScenarioError on anything wrong."""
    reader, root = open_yaml(path)
    kind, top = _header(reader, root)
    _expect_kind(reader, top, kind, "Scenario")
    return _scenario(reader, top, Path(path))


def load_suite(path: str | Path) -> Suite:
    """Read and check the suite file ``path``; its scenario paths must exist (they are not
    loaded here)."""
    reader, root = open_yaml(path)
    kind, top = _header(reader, root)
    _expect_kind(reader, top, kind, "Suite")
    return _suite(reader, top, Path(path))


def load_document(path: str | Path) -> Scenario | Suite:
    """Read a scenario or a suite file, whichever its ``kind`` says it is."""
    reader, root = open_yaml(path)
    kind, top = _header(reader, root)
    if kind == "Suite":
        return _suite(reader, top, Path(path))
    return _scenario(reader, top, Path(path))


# --------------------------------------------------------------------------------------------
# The file and its header


def _header(reader: Reader, root: Node) -> tuple[str, Fields]:
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


def _expect_kind(reader: Reader, top: Fields, kind: str, expected: str) -> None:
    if kind != expected:
        raise reader.error(top.values["kind"], "kind",
                           f"this is a {kind} file, but a {expected} was expected; "
                           f"pass a {expected} file here")


# --------------------------------------------------------------------------------------------
# Scenario


def _scenario(reader: Reader, top: Fields, path: Path) -> Scenario:
    meta = reader.mapping(top.values["metadata"], "metadata",
                          ("name", "description", "dangerous", "tags"), ("name",))
    name = reader.name(meta.values["name"], "metadata.name")
    description = _optional_string(reader, meta, "description")
    dangerous = reader.boolean(meta.values["dangerous"], "metadata.dangerous") \
        if "dangerous" in meta else False
    tags: tuple[str, ...] = ()
    if "tags" in meta:
        items = reader.sequence(meta.values["tags"], "metadata.tags", "a list of strings",
                                nonempty=False, limit=L.TAGS_MAX, what="tags")
        tags = tuple(reader.string(n, f"metadata.tags[{i}]") for i, n in enumerate(items))

    spec = reader.mapping(top.values["spec"], "spec",
                          ("pool", "streams", "trials", "timeout", "variants", "amplify",
                           "steps", "workload"), ("pool", "variants"))
    pool = _pool(reader, spec.values["pool"], "spec.pool")
    trials = reader.integer(spec.values["trials"], "spec.trials", 1, limit=L.TRIALS_MAX,
                            what="trials a scenario may ask for") if "trials" in spec else 100
    timeout = reader.number(spec.values["timeout"], "spec.timeout",
                            "a positive number of seconds", positive=True,
                            limit=L.TIMEOUT_MAX_S, what="seconds a trial may take (a day)") \
        if "timeout" in spec else 10.0
    declared = "streams" in spec
    streams = _streams(reader, spec.values["streams"], "spec.streams") if declared \
        else DEFAULT_STREAMS
    variants = _variants(reader, spec.values["variants"], "spec.variants", streams)

    steps: tuple[Step, ...] = ()
    workload: Workload | None = None
    if "steps" in spec and "workload" in spec:
        later = max(("steps", "workload"), key=lambda k: spec.keys[k].start_mark.index)
        raise reader.error(spec.keys[later], spec.sub(later),
                           "a scenario has either steps or a workload, not both; remove one")
    world = _world(reader, spec.values["pool"], pool, len(streams))
    if "steps" in spec:
        steps = StepList(reader, [v.name for v in variants], streams, declared,
                         world, allocator=pool.allocator).parse(spec.values["steps"],
                                                                "spec.steps")
    elif "workload" in spec:
        if declared:
            raise reader.error(spec.keys["streams"], "spec.streams", "a workload runs on the "
                               "default streams (compute, transfer, legacy); declare streams "
                               "in a scenario with steps")
        workload = _workload(reader, spec.values["workload"], "spec.workload", pool)
    else:
        raise reader.error(spec.node, "spec", "a scenario needs steps (a list of steps) or a "
                           "workload; add one")

    amplify = _amplify(reader, spec.values["amplify"], "spec.amplify", steps, workload,
                       variants, streams, declared) if "amplify" in spec else None
    return Scenario(name=name, path=path, description=description, dangerous=dangerous,
                    pool=pool, trials=trials, timeout_s=timeout, variants=variants,
                    amplify=amplify, steps=steps, workload=workload, tags=tags,
                    streams=streams, declared_streams=declared)


def _optional_string(reader: Reader, fields: Fields, key: str) -> str:
    return reader.string(fields.values[key], fields.sub(key)) if key in fields else ""


def _streams(reader: Reader, node: Node, path: str) -> tuple[StreamSpec, ...]:
    """``spec.streams``: name -> kind, or name -> {kind, priority}."""
    f = reader.fields(node, path, "a mapping of stream names to kinds")
    if not f.values:
        raise reader.error(node, path, "declare at least one stream, e.g. "
                           "streams: {compute: non-blocking, copy: non-blocking}")
    reader.at_most(node, path, len(f.values), L.STREAMS_MAX, "streams",
                   "a scenario may declare")
    streams = []
    legacy = None
    for name, value in f.values.items():
        sub = f.sub(name)
        if reader.is_null(f.keys[name]):  # `null: legacy`: a stream no step could name
            raise reader.error(f.keys[name], sub, f"YAML reads {name} as nothing (null), "
                               f"not a name: quote it ('{name}') to name a stream so; the "
                               "legacy default stream (CUDA's null stream) is any name of "
                               "kind legacy")
        reader.name(f.keys[name], sub, text=name)
        priority = 0
        if isinstance(value, MappingNode):
            g = reader.mapping(value, sub, ("kind", "priority"), what=f"stream {name!r}")
            kind = reader.choice(g.values["kind"], g.sub("kind"), STREAM_KINDS, "stream kind") \
                if "kind" in g else "non-blocking"
            if "priority" in g:
                priority = reader.integer(g.values["priority"], g.sub("priority"),
                                          L.PRIORITY_MIN, L.PRIORITY_MAX)
                if kind == "legacy":
                    raise reader.error(g.values["priority"], g.sub("priority"), "the legacy "
                                       "stream has the default priority; remove this")
        else:
            kind = reader.choice(value, sub, STREAM_KINDS, "stream kind")
        if kind == "legacy":
            if legacy is not None:
                raise reader.error(f.keys[name], sub, f"there is one legacy default stream, "
                                   f"and {legacy!r} is it already; make this one non-blocking "
                                   "or blocking")
            legacy = name
        streams.append(StreamSpec(name, kind, priority))
    return tuple(streams)


def _pool(reader: Reader, node: Node, path: str) -> PoolSpec:
    f = reader.mapping(node, path, ("pages", "page_tokens", "planes", "table_rows",
                                    "max_pages_per_row", "allocator"), ("pages",),
                       what="the pool")
    defaults = PoolSpec(pages=1)
    planes = defaults.planes
    if "planes" in f:
        items = reader.sequence(f.values["planes"], f.sub("planes"), "a non-empty list of planes",
                                limit=L.PLANES_MAX, what="planes")
        planes = tuple(_plane(reader, n, f"{f.sub('planes')}[{i}]") for i, n in enumerate(items))

    def count(key: str, default: int, limit: int, what: str, minimum: int = 1) -> int:
        return reader.integer(f.values[key], f.sub(key), minimum, limit=limit, what=what) \
            if key in f else default

    pages = count("pages", 1, L.POOL_MAX_PAGES, "pages of a pool")
    pool = PoolSpec(pages=pages,
                    page_tokens=count("page_tokens", defaults.page_tokens, L.PAGE_MAX_TOKENS,
                                      "tokens of a page"),
                    planes=planes,
                    table_rows=count("table_rows", defaults.table_rows, L.TABLE_MAX_ROWS,
                                     "rows of the execution table"),
                    max_pages_per_row=count("max_pages_per_row", 0, L.POOL_MAX_PAGES,
                                            "pages of a table row", minimum=0),
                    allocator=reader.choice(f.values["allocator"], f.sub("allocator"),
                                            kvcore.pool.ALLOCATORS, "allocator")
                    if "allocator" in f else "fenced")
    stride = kvcore.plan_host_kv_page_layout(pool.geometry()).page_stride
    if stride > L.PAGE_MAX_BYTES:
        at = "planes" if "planes" in f else "page_tokens" if "page_tokens" in f else "pages"
        raise reader.error(f.values[at], f.sub(at), f"a page of this geometry takes "
                           f"{stride:,} bytes, more than {L.PAGE_MAX_BYTES:,}, the most a page "
                           "may; use fewer page_tokens, or smaller planes")
    return pool


def _world(reader: Reader, node: Node, pool: PoolSpec, streams: int) -> Footprint:
    """What the scenario's world allocates before any step (harness.lang.footprint); refused when
    that alone is over the limit."""
    stride = kvcore.plan_host_kv_page_layout(pool.geometry()).page_stride
    world = Footprint(pool.pages, stride, pool.table_rows, pool.max_pages_per_row or pool.pages,
                      streams + 1)
    if world.fixed_bytes > L.WORLD_MAX_BYTES:
        raise reader.error(node, "spec.pool", f"the pool needs {world.fixed_bytes:,} bytes "
                           f"({world.describe()}), more than {L.WORLD_MAX_BYTES:,} (1 GiB), the "
                           "most a scenario's world may allocate; use fewer or smaller pages, "
                           "or fewer table rows")
    return world


def _plane(reader: Reader, node: Node, path: str) -> PlaneSpec:
    f = reader.mapping(node, path, ("dtype", "leading", "heads", "align"),
                       ("dtype", "leading", "heads"), what="a plane")
    dtype = reader.choice(f.values["dtype"], f.sub("dtype"), DTYPES, "dtype")
    align = 256
    if "align" in f:
        align = reader.integer(f.values["align"], f.sub("align"), 1, limit=L.ALIGN_MAX,
                               what="a plane's align")
        if align & (align - 1):
            raise reader.error(f.values["align"], f.sub("align"),
                               f"align must be a power of two (64, 128, 256...), not {align}")
    def dim(key: str) -> int:
        return reader.integer(f.values[key], f.sub(key), 1, limit=L.PLANE_MAX_DIM,
                              what=f"a plane's {key}")

    return PlaneSpec(dtype=dtype, leading=dim("leading"), heads=dim("heads"), align=align)


def _variants(reader: Reader, node: Node, path: str,
              streams: tuple[StreamSpec, ...]) -> tuple[Variant, ...]:
    f = reader.fields(node, path, "a mapping of variant names to variants")
    if not f.values:
        raise reader.error(node, path, "a scenario needs at least one variant, e.g. "
                           "buggy: {defects: {release_fence: false}, expect: reproduces}")
    reader.at_most(node, path, len(f.values), L.VARIANTS_MAX, "variants",
                   "a scenario may have")
    return tuple(_variant(reader, f, name, streams) for name in f.values)


def _variant(reader: Reader, variants: Fields, name: str,
             streams: tuple[StreamSpec, ...]) -> Variant:
    path = variants.sub(name)
    reader.name(variants.keys[name], path, text=name)
    f = reader.mapping(variants.values[name], path, ("defects", "expect", "min_rate", "streams"),
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
    kinds: tuple[tuple[str, str], ...] = ()
    if "streams" in f:
        kinds = _stream_kinds(reader, f.values["streams"], f.sub("streams"), streams)
    return Variant(name=name, defects=defects, expect=expect, min_rate=min_rate, streams=kinds)


def _stream_kinds(reader: Reader, node: Node, path: str,
                  streams: tuple[StreamSpec, ...]) -> tuple[tuple[str, str], ...]:
    """A variant's ``streams``: the kind of some declared streams in this variant (a fix that
    makes a stream blocking, say)."""
    g = reader.fields(node, path, "a mapping of stream names to kinds")
    by_name = {s.name: s for s in streams}
    kinds = []
    for stream, value in g.values.items():
        sub = g.sub(stream)
        if stream not in by_name:
            raise reader.error(g.keys[stream], sub, f"unknown stream {stream!r}"
                               f"{suggest(stream, by_name)}; this scenario's streams are "
                               f"{', '.join(by_name)}")
        kind = reader.choice(value, sub, STREAM_KINDS, "stream kind")
        if "legacy" in (kind, by_name[stream].kind) and kind != by_name[stream].kind:
            raise reader.error(value, sub, "a variant can make a stream blocking or "
                               "non-blocking, not turn it into or out of the legacy stream")
        kinds.append((stream, kind))
    return tuple(kinds)


def _workload(reader: Reader, node: Node, path: str, pool: PoolSpec) -> Workload:
    f = reader.mapping(node, path, ("kind", "requests", "initial_pages", "pages_per_turn",
                                    "churn_pages", "path"), ("kind",), what="the workload")
    kind = reader.choice(f.values["kind"], f.sub("kind"), WORKLOAD_KINDS, "workload kind")
    if kind == "ticket":
        if "path" not in f:
            raise reader.error(node, path, "a ticket workload needs `path:` (a "
                                           "gpurace.ticket/1 file, relative to this file)")
        text = reader.string(f.values["path"], f.sub("path"))
        ticket = Path(reader.file).parent / text
        if not is_file(ticket):
            raise reader.error(f.values["path"], f.sub("path"),
                               f"no ticket file at {show_path(ticket)}; record one or fix the "
                               "path")
        # Read now: a ticket the replay cannot run is refused here, not in a worker; said at
        # this path, with the ticket's own file:line:col.
        try:
            load_ticket(ticket)
        except TraceError as exc:
            raise reader.error(f.values["path"], f.sub("path"), f"the ticket is refused: {exc}")\
                from None
        return Workload(kind=kind, ticket=ticket)
    if "path" in f:
        raise reader.error(f.values["path"], f.sub("path"),
                           "`path` belongs to a ticket workload (kind: ticket)")
    defaults = Workload()
    bounds = {"requests": (1, L.REQUESTS_MAX), "initial_pages": (0, L.POOL_MAX_PAGES),
              "pages_per_turn": (1, L.POOL_MAX_PAGES), "churn_pages": (0, L.POOL_MAX_PAGES)}
    counts = {key: reader.integer(f.values[key], f.sub(key), low, limit=high,
                                  what=f"a workload's {key}") if key in f
              else getattr(defaults, key) for key, (low, high) in bounds.items()}
    workload = Workload(kind=kind, **counts)
    _conversation_fits(reader, f, workload, pool)
    return workload


def _conversation_fits(reader: Reader, f: Fields, w: Workload, pool: PoolSpec) -> None:
    """What kvcore would refuse in the conversation workload, said at load: its retained pages
    (initial, plus pages_per_turn each request) and the churn lane's pages must fit the pool,
    and every retained page the table row the catalog is published into."""
    kept = w.initial_pages + w.requests * w.pages_per_turn
    at = "requests" if "requests" in f else "pages_per_turn" if "pages_per_turn" in f else None
    node, path = (f.values[at], f.sub(at)) if at else (f.node, f.path)
    if kept > pool.pages:
        raise reader.error(node, path, (
            f"the conversation retains {kept:,} pages by its last request ({w.initial_pages} "
            f"initial, then {w.pages_per_turn} per request for {w.requests} requests), more "
            f"than the pool's {pool.pages}; raise spec.pool.pages or use fewer requests"))
    peak = kept - w.pages_per_turn + w.churn_pages
    if peak > pool.pages:
        node, path = (f.values["churn_pages"], f.sub("churn_pages")) \
            if "churn_pages" in f else (node, path)
        raise reader.error(node, path, (
            f"at the last request the churn lane's {w.churn_pages} pages join the "
            f"{kept - w.pages_per_turn:,} pages the conversation retains: {peak:,}, more than "
            f"the pool's {pool.pages}; raise spec.pool.pages or lower churn_pages"))
    row = pool.max_pages_per_row or pool.pages
    if kept > row:
        raise reader.error(node, path, (
            f"the conversation's catalog holds {kept:,} pages by its last request, more than "
            f"a table row's {row} (spec.pool.max_pages_per_row); raise it or use fewer "
            "requests"))


def is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False for a path the system cannot even look up (too long,
    a NUL byte in it)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _amplify(reader: Reader, node: Node, path: str, steps: tuple[Step, ...],
             workload: Workload | None, variants: tuple[Variant, ...],
             streams: tuple[StreamSpec, ...], declared: bool) -> Amplify:
    f = reader.mapping(node, path, ("delay_us", "stream", "before", "sweep", "hold"),
                       ("delay_us", "before"), what="amplify")
    delay = reader.number(f.values["delay_us"], f.sub("delay_us"),
                          "a non-negative number of microseconds", limit=L.DELAY_MAX_US,
                          what="microseconds of a delay (10 s)")
    stream = None
    if "stream" in f:
        names = {s.name for s in streams}
        stream = reader.string(f.values["stream"], f.sub("stream"))
        if not declared:
            stream = STREAM_ALIASES.get(stream, stream)
        if stream not in names:
            raise reader.error(f.values["stream"], f.sub("stream"),
                               unknown_stream(stream, [s.name for s in streams], declared))
    sweep: tuple[float, ...] = ()
    if "sweep" in f:
        items = reader.sequence(f.values["sweep"], f.sub("sweep"),
                                "a list of delays in microseconds", nonempty=False,
                                limit=L.SWEEP_MAX, what="sweep delays")
        sweep = tuple(reader.number(n, f"{f.sub('sweep')}[{i}]",
                                    "a non-negative number of microseconds",
                                    limit=L.DELAY_MAX_US, what="microseconds of a delay (10 s)")
                      for i, n in enumerate(items))
    before_node, before_path = f.values["before"], f.sub("before")
    if workload is not None:
        before = reader.choice(before_node, before_path, WORKLOAD_PHASES, "workload phase")
        if stream is None:
            raise reader.error(node, path, "amplify needs `stream` in a workload scenario "
                               "(the stream to delay before that phase)")
        if "hold" in f:
            raise reader.error(f.keys["hold"], f.sub("hold"), "`hold` holds back a host thread "
                               "of a step scenario; a workload has none")
        return Amplify(delay_us=delay, stream=stream, before=before, sweep=sweep)
    before = reader.string(before_node, before_path)
    found = _every_variants_step(reader, before_node, before_path, before, steps, variants,
                                 "delay")
    for variant, step in zip(variants, found):
        if stream is None and "stream" not in step.args:
            raise reader.error(node, path, f"step {before!r} runs on no stream ({step.op}); "
                               "say which stream to delay with `stream`")
        captured = _captured_by(steps, variant.name, step)
        delayed = stream or step.args.get("stream")
        if captured is not None and delayed != captured.args["stream"]:
            graph, on = captured.id, captured.args["stream"]
            raise reader.error(f.values.get("stream", node), f.sub("stream") if "stream" in f
                               else path, (
                f"step {before!r} is captured into graph {graph!r} (steps[{captured.index}]): a "
                f"delay before it on {delayed!r} would run once, at the capture, not at each "
                f"replay; delay {on!r} (the graph's stream: the delay becomes a node of it), or "
                "amplify before the graph_replay"))
    held: list[str] = []
    if "hold" in f:
        for item, where in reader.one_or_list(f.values["hold"], f.sub("hold"),
                                              "a step id or a list of them",
                                              limit=L.STEPS_MAX, what="held steps"):
            name = reader.string(item, where)
            if name in held:
                raise reader.error(item, where, f"step {name!r} is held twice; name it once")
            for step in _every_variants_step(reader, item, where, name, steps, variants,
                                             "hold back"):
                if step.thread is None:
                    raise reader.error(item, where, (
                        f"step {name!r} runs on no host thread; `hold` holds a thread back "
                        "before one of its steps: name a step with `thread:`"))
            held.append(name)
    return Amplify(delay_us=delay, stream=stream, before=before, sweep=sweep, hold=tuple(held))


def _captured_by(steps: tuple[Step, ...], variant: str, step: Step) -> Step | None:
    """The graph_capture step whose capture ``step`` stands in (in ``variant``), or None."""
    capture = None
    for s in steps:
        if not s.runs_in(variant):
            continue
        if s is step:
            return capture
        if s.op == "graph_capture":
            capture = s
        elif s.op == "graph_end":
            capture = None
    return None


def _every_variants_step(reader: Reader, node: Node, path: str, name: str,
                         steps: tuple[Step, ...], variants: tuple[Variant, ...],
                         what: str) -> list[Step]:
    """The step with id ``name`` in each variant (amplify's ``before`` and ``hold``)."""
    ids = list(dict.fromkeys(s.id for s in steps if s.id is not None))
    if name not in ids:
        known = f"step ids: {_some(ids)}" if ids else \
            f"no step has an id; give the step to {what} one"
        raise reader.error(node, path,
                           f"no step has id {echo(name)}{suggest(name, ids)}; {known}")
    found = []
    for variant in variants:
        step = next((s for s in steps if s.id == name and s.runs_in(variant.name)), None)
        if step is None:
            other = next(s for s in steps if s.id == name)
            raise reader.error(node, path, (
                f"variant {variant.name} runs no step with id {name!r} (steps[{other.index}] "
                f"runs only in {', '.join(sorted(other.only or ()))}); amplify a step every "
                f"variant runs, or give {variant.name} a step with this id"))
        found.append(step)
    return found


# --------------------------------------------------------------------------------------------
# Suite


def _suite(reader: Reader, top: Fields, path: Path) -> Suite:
    meta = reader.mapping(top.values["metadata"], "metadata", ("name", "description"),
                          ("name",))
    name = reader.name(meta.values["name"], "metadata.name")
    description = _optional_string(reader, meta, "description")
    spec = reader.mapping(top.values["spec"], "spec", ("scenarios",), ("scenarios",))
    items = reader.sequence(spec.values["scenarios"], "spec.scenarios",
                            "a non-empty list of scenario file paths", limit=L.STEPS_MAX,
                            what="scenarios")
    folder = path.parent
    scenarios: list[Path] = []
    itself = _resolved(path)
    for i, item in enumerate(items):
        item_path = f"spec.scenarios[{i}]"
        text = reader.string(item, item_path)
        resolved = _resolved(folder / text)
        if resolved is None or not is_file(resolved):
            shown = show_path(resolved if resolved is not None else text)
            raise reader.error(item, item_path, f"no scenario file at {shown} (paths are "
                               f"relative to the suite's folder, {folder.resolve()})")
        if resolved == itself or _kind_of(resolved) == "Suite":
            # Suites within suites could list each other, round and round.
            raise reader.error(item, item_path, f"{show_path(resolved)} is a suite, and a suite "
                               "lists scenario files; list that suite's scenarios here")
        if resolved in scenarios:
            raise reader.error(item, item_path, f"{show_path(resolved)} is listed twice; "
                               "remove one")
        scenarios.append(resolved)
    return Suite(name=name, path=path, description=description, scenarios=tuple(scenarios))


def _kind_of(path: Path) -> str | None:
    """The ``kind`` a YAML file says it is, read without checking the rest (None when it says
    none, or cannot be read: that is for whoever loads it to say)."""
    try:
        _, root = open_yaml(path)
    except ScenarioError:
        return None
    if not isinstance(root, MappingNode):
        return None
    for key, value in root.value:
        if isinstance(key, ScalarNode) and key.value == "kind" and isinstance(value, ScalarNode):
            return str(value.value)
    return None


def _resolved(path: Path) -> Path | None:
    """``path`` made absolute, or None when the system cannot look it up."""
    try:
        return path.resolve()
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a name too long, a symlink loop
        return None


def _some(names: list[str], most: int = 20) -> str:
    """A list of names for a message: the first ``most``, and how many more."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"
