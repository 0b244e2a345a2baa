"""Load scenario and suite files (YAML) into the frozen records of :mod:`harness.model`.

The loader is strict: an unknown key, a wrong type, a duplicate key or a reference to a stream,
lease, catalog, buffer, event, variant or step that does not exist (yet, or in some variant) is
a :class:`~harness.errors.ScenarioError` whose message starts ``file:line:col: path:``, pointing
at the YAML node to fix. The step list is checked per variant by :mod:`harness.steplist`.
"""

from __future__ import annotations

from pathlib import Path

from yaml.nodes import MappingNode, Node

import kvcore
from harness.model import (
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
from harness.steplist import StepList, unknown_stream
from harness.yamlnodes import API_VERSION, NAME_PATTERN, ROOT, Fields, Reader, open_yaml, suggest

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
                                nonempty=False)
        tags = tuple(reader.string(n, f"metadata.tags[{i}]") for i, n in enumerate(items))

    spec = reader.mapping(top.values["spec"], "spec",
                          ("pool", "streams", "trials", "timeout", "variants", "amplify",
                           "steps", "workload"), ("pool", "variants"))
    pool = _pool(reader, spec.values["pool"], "spec.pool")
    trials = reader.integer(spec.values["trials"], "spec.trials", 1) \
        if "trials" in spec else 100
    timeout = reader.number(spec.values["timeout"], "spec.timeout",
                            "a positive number of seconds", positive=True) \
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
    if "steps" in spec:
        page_bytes = kvcore.plan_host_kv_page_layout(pool.geometry()).page_stride
        steps = StepList(reader, [v.name for v in variants], streams, declared,
                         page_bytes).parse(spec.values["steps"], "spec.steps")
    elif "workload" in spec:
        if declared:
            raise reader.error(spec.keys["streams"], "spec.streams", "a workload runs on the "
                               "default streams (compute, transfer, legacy); declare streams "
                               "in a scenario with steps")
        workload = _workload(reader, spec.values["workload"], "spec.workload")
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
    streams = []
    legacy = None
    for name, value in f.values.items():
        sub = f.sub(name)
        reader.name(f.keys[name], sub, text=name)
        priority = 0
        if isinstance(value, MappingNode):
            g = reader.mapping(value, sub, ("kind", "priority"), what=f"stream {name!r}")
            kind = reader.choice(g.values["kind"], g.sub("kind"), STREAM_KINDS, "stream kind") \
                if "kind" in g else "non-blocking"
            if "priority" in g:
                priority = reader.integer(g.values["priority"], g.sub("priority"))
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


def _plane(reader: Reader, node: Node, path: str) -> PlaneSpec:
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


def _variants(reader: Reader, node: Node, path: str,
              streams: tuple[StreamSpec, ...]) -> tuple[Variant, ...]:
    f = reader.fields(node, path, "a mapping of variant names to variants")
    if not f.values:
        raise reader.error(node, path, "a scenario needs at least one variant, e.g. "
                           "buggy: {defects: {release_fence: false}, expect: reproduces}")
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


def _workload(reader: Reader, node: Node, path: str) -> Workload:
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


def _amplify(reader: Reader, node: Node, path: str, steps: tuple[Step, ...],
             workload: Workload | None, variants: tuple[Variant, ...],
             streams: tuple[StreamSpec, ...], declared: bool) -> Amplify:
    f = reader.mapping(node, path, ("delay_us", "stream", "before", "sweep"),
                       ("delay_us", "before"), what="amplify")
    delay = reader.number(f.values["delay_us"], f.sub("delay_us"),
                          "a non-negative number of microseconds")
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
                                "a list of delays in microseconds", nonempty=False)
        sweep = tuple(reader.number(n, f"{f.sub('sweep')}[{i}]",
                                    "a non-negative number of microseconds")
                      for i, n in enumerate(items))
    before_node, before_path = f.values["before"], f.sub("before")
    if workload is not None:
        before = reader.choice(before_node, before_path, WORKLOAD_PHASES, "workload phase")
        if stream is None:
            raise reader.error(node, path, "amplify needs `stream` in a workload scenario "
                               "(the stream to delay before that phase)")
        return Amplify(delay_us=delay, stream=stream, before=before, sweep=sweep)
    before = reader.string(before_node, before_path)
    ids = list(dict.fromkeys(s.id for s in steps if s.id is not None))
    if before not in ids:
        known = f"step ids: {', '.join(ids)}" if ids else \
            "no step has an id; give the step to delay one"
        raise reader.error(before_node, before_path,
                           f"no step has id {before!r}{suggest(before, ids)}; {known}")
    for variant in variants:
        step = next((s for s in steps if s.id == before and s.runs_in(variant.name)), None)
        if step is None:
            other = next(s for s in steps if s.id == before)
            raise reader.error(before_node, before_path, (
                f"variant {variant.name} runs no step with id {before!r} (steps[{other.index}] "
                f"runs only in {', '.join(sorted(other.only or ()))}); amplify a step every "
                f"variant runs, or give {variant.name} a step with this id"))
        if stream is None and "stream" not in step.args:
            raise reader.error(node, path, f"step {before!r} runs on no stream ({step.op}); "
                               "say which stream to delay with `stream`")
    return Amplify(delay_us=delay, stream=stream, before=before, sweep=sweep)


# --------------------------------------------------------------------------------------------
# Suite


def _suite(reader: Reader, top: Fields, path: Path) -> Suite:
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
