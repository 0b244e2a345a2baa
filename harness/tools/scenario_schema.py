"""The JSON Schema of scenario and suite files (``scenario.schema.json``), for editors: built
from the step vocabulary (:mod:`harness.lang.vocabulary`), the bounds (:mod:`harness.limits`)
and the scenario model's choices, so a new step op, key or bound cannot leave it behind.
"""

from __future__ import annotations


import kvcore
from harness import limits as L
from harness.lang import vocabulary as V
from harness.lang.model import EXPECTATIONS, STREAM_KINDS, WORKLOAD_PHASES
from harness.lang.scenario import API_VERSION, KINDS, WORKLOAD_KINDS
from harness.tools.schema_words import (BOOLEAN, NAME, TEXT, Schema, array, closed, const,
                                        described, document, enum, integer, number, ref,
                                        string)

INFINITY_AS_BOUND = 1.7976931348623157e308
"""The largest finite float: a number at least this large is YAML's ``.inf``, which JSON cannot
write. A delay step's ``us`` is at most DELAY_MAX_US, or ``.inf``."""


def _value(op: str, key: str) -> Schema:
    """What a step key holds (harness.lang.vocabulary), bounded as harness.lang.steplist bounds
    it."""
    holds = V.holds(op, key)
    in_bytes = key in ("offset", "length")
    limit = L.WORLD_MAX_BYTES if in_bytes else L.POOL_MAX_PAGES
    words = V.IN_WORDS[holds]
    if holds == V.COUNT:
        return described(integer(1, limit), words)
    if holds == V.INDEX:
        return described(integer(0, limit), words)
    if holds == V.PAGES:
        page = integer(0, limit)
        return described({"anyOf": [page, array(page, 1, L.POOL_MAX_PAGES)]}, words)
    if holds == V.BYTE:
        return described(integer(0, 255), words)
    if holds == V.MICROS:
        return described(number(exclusiveMinimum=0, maximum=L.DELAY_MAX_US), words)
    if holds == V.DURATION:
        return described(number(exclusiveMinimum=0, anyOf=[
            {"maximum": L.DELAY_MAX_US}, {"minimum": INFINITY_AS_BOUND}]), words)
    if holds == V.BOOL:
        return described(BOOLEAN, words)
    if holds == V.EVENTS:
        return described({"anyOf": [ref("name"), array(ref("name"), 1)]}, words)
    if holds == V.MEMORY:
        page = integer(0, L.POOL_MAX_PAGES)
        nbytes = integer(0, L.WORLD_MAX_BYTES)
        part = closed({"lease": ref("name"), "buffer": ref("name"),
                       "page": {"anyOf": [page, array(page, 1, L.POOL_MAX_PAGES)]},
                       "offset": nbytes, "length": integer(1, L.WORLD_MAX_BYTES)}, [],
                      oneOf=[{"required": ["lease"]}, {"required": ["buffer"]}])
        item = {"anyOf": [ref("name"), part]}
        return described({"anyOf": [item, array(item, 1, L.KERNEL_MEMORY_MAX)]}, words)
    return {"description": words, **ref("name")}  # a stream, or a thing's name


def _step(op: str) -> Schema:
    spec = V.OPS[op]
    variants = {"anyOf": [ref("name"), array(ref("name"), 1)]}
    props: dict[str, Schema] = {
        "id": described(ref("name"), f"names the {spec.id_defines} later steps refer to"
                        if spec.id_defines else "names the step (for amplify.before)"),
        "op": const(op),
        "only": described(variants, "run in these variants only"),
        "unless": described(variants, "run in every variant but these"),
        V.THREAD_KEY: described(ref("name"), "the host thread it runs on; consecutive steps "
                                "with a thread run as threads, concurrently"),
    }
    props.update({key: _value(op, key) for key in spec.keys})
    required = ["op", *(("id",) if spec.id_defines else ()), *spec.required()]
    schema = closed(props, required, description=spec.doc)
    groups = [{"oneOf": [{"required": [k]} for k in keys]} for keys, _ in spec.one_of]
    if groups:
        schema["allOf"] = groups
    if spec.at_most_one:
        schema["not"] = {"required": list(spec.at_most_one)}
    return schema


def _scenario_defs() -> dict[str, Schema]:
    delay = number(0, L.DELAY_MAX_US)
    pool = closed({
        "pages": integer(1, L.POOL_MAX_PAGES), "page_tokens": integer(1, L.PAGE_MAX_TOKENS),
        "planes": array(closed({
            "dtype": enum(d.label for d in kvcore.DType),
            "leading": integer(1, L.PLANE_MAX_DIM), "heads": integer(1, L.PLANE_MAX_DIM),
            "align": described(enum(1 << i for i in range(L.ALIGN_MAX.bit_length())),
                               "a power of two"),
        }, ["dtype", "leading", "heads"]), 1, L.PLANES_MAX),
        "table_rows": integer(1, L.TABLE_MAX_ROWS),
        "max_pages_per_row": described(integer(0, L.POOL_MAX_PAGES), "0: as many as the pool"),
        "allocator": described(enum(kvcore.pool.ALLOCATORS),
                               "fenced (the default): a release fences every stream that used "
                               "a page; caching: per-stream free lists and record_stream"),
    }, ["pages"])
    stream_kind = enum(STREAM_KINDS)
    streams = {"type": "object", "propertyNames": ref("name"), "minProperties": 1,
               "maxProperties": L.STREAMS_MAX,
               "additionalProperties": {"anyOf": [stream_kind, closed({
                   "kind": stream_kind, "priority": integer(L.PRIORITY_MIN, L.PRIORITY_MAX)},
                   [])]}}
    variant = closed({
        "defects": closed({name: BOOLEAN for name in kvcore.Defects.names()}, []),
        "expect": enum(EXPECTATIONS), "min_rate": number(0, 1),
        "streams": {"type": "object", "propertyNames": ref("name"),
                    "additionalProperties": stream_kind},
    }, [])
    workload = closed({
        "kind": enum(WORKLOAD_KINDS), "requests": integer(1, L.REQUESTS_MAX),
        "initial_pages": integer(0, L.POOL_MAX_PAGES),
        "pages_per_turn": integer(1, L.POOL_MAX_PAGES),
        "churn_pages": integer(0, L.POOL_MAX_PAGES),
        "path": described(TEXT, "a gpurace.ticket/1 file, relative to this file"),
    }, ["kind"], allOf=[{"if": {"properties": {"kind": const("ticket")}},
                         "then": {"required": ["path"]},
                         "else": {"not": {"required": ["path"]}}}])
    amplify = closed({
        "delay_us": delay, "stream": ref("name"),
        "before": described(TEXT, "a step id, or a workload phase: "
                            + ", ".join(WORKLOAD_PHASES)),
        "sweep": array(delay, max_items=L.SWEEP_MAX),
        "hold": described({"anyOf": [ref("name"), array(ref("name"), 1)]},
                          "steps of host threads: each thread is held back before its step "
                          "while another can go on; when all are held, the first listed goes on"),
    }, ["delay_us", "before"])
    spec = closed({
        "pool": pool, "streams": streams, "trials": integer(1, L.TRIALS_MAX),
        "timeout": number(exclusiveMinimum=0, maximum=L.TIMEOUT_MAX_S),
        "variants": {"type": "object", "propertyNames": ref("name"), "minProperties": 1,
                     "maxProperties": L.VARIANTS_MAX, "additionalProperties": ref("variant")},
        "amplify": amplify,
        "steps": array(ref("step"), 1, L.STEPS_MAX),
        "workload": workload,
    }, ["pool", "variants"], oneOf=[{"required": ["steps"]}, {"required": ["workload"]}],
        allOf=[{"if": {"required": ["workload"]}, "then": {
            "not": {"required": ["streams"]},
            "properties": {"amplify": {"required": ["stream"],
                                       "properties": {"before": enum(WORKLOAD_PHASES)}}}}}])
    step = {"type": "object", "required": ["op"],
            "properties": {"op": enum(V.OPS)},
            "not": {"required": list(V.VARIANT_KEYS)},
            "allOf": [{"if": {"properties": {"op": const(op)}, "required": ["op"]},
                       "then": ref(f"step-{op}")} for op in V.OPS]}
    return {
        "name": NAME,
        "scenario-metadata": closed({
            "name": ref("name"), "description": TEXT, "dangerous": BOOLEAN,
            "tags": array(TEXT, max_items=L.TAGS_MAX)}, ["name"]),
        "scenario-spec": spec, "pool": pool, "variant": variant, "step": step,
        **{f"step-{op}": _step(op) for op in V.OPS},
        "suite-metadata": closed({"name": ref("name"), "description": TEXT}, ["name"]),
        "suite-spec": closed({"scenarios": described(
            array(string(L.TEXT_MAX_CHARS, minLength=1), 1, L.STEPS_MAX),
            "scenario files, relative to the suite's folder")}),
    }


def scenario_schema() -> Schema:
    body = {
        "type": "object",
        "properties": {"apiVersion": const(API_VERSION), "kind": enum(KINDS),
                       "metadata": {"type": "object"}, "spec": {"type": "object"}},
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "if": {"properties": {"kind": const("Suite")}, "required": ["kind"]},
        "then": {"properties": {"metadata": ref("suite-metadata"),
                                "spec": ref("suite-spec")}},
        "else": {"properties": {"metadata": ref("scenario-metadata"),
                                "spec": ref("scenario-spec")}},
    }
    return document(
        "gpurace scenario or suite", f"A scenario or suite file (apiVersion {API_VERSION}), for "
        "editors: put `# yaml-language-server: $schema=PATH/scenario.schema.json` on its first "
        "line. The step ops and their keys are harness.lang.vocabulary's, the bounds "
        "harness.limits'. What a schema cannot see (a name used before a step defines it, in "
        "some variant; the pool's bytes) `gpurace run` checks, at its file:line:col.",
        body, _scenario_defs())
