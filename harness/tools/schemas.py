"""Build gpurace's JSON Schemas (draft 2020-12) from the code that writes and reads each document.

Every schema is made here (the scenario files' in :mod:`harness.tools.scenario_schema`, all in
the words of :mod:`harness.tools.schema_words`), from the definitions it describes: the step
vocabulary (:mod:`harness.lang.vocabulary`), the bounds (:mod:`harness.limits`), the scenario
model's choices (:mod:`harness.lang.model`), kvcore's dtypes, defects and op kinds, and the
producers' enums. The
files in harness/schemas/ are what :func:`schemas` returns, written by ``python -m
harness.tools.schemas``; tests/test_schemas.py checks that the committed files equal what this
module builds, so a new step op, key, bound or outcome cannot leave a schema behind.

Each schema is self-contained (no reference to another file), so an editor or a validator needs
only the one file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import kvcore
from harness import limits as L
from harness.cli.catalog import LIST_SCHEMA
from harness.cli.traces import CHECK_SCHEMA
from harness.analyses.explore import StopReason, Strategy
from harness.lang.model import EXPECTATIONS
from harness.results.outcome import Outcome, Status
from harness.results.exitcodes import ExitCode
from harness.results.run import RUN_SCHEMA
from harness.traces.optrace import TRACE_SCHEMA
from harness.traces.ticket import KV_DTYPES, TICKET_SCHEMA
from harness.gpu.xid import APPLICATION, GPU_FATAL
from kvcore.device.oplog import HOST, HOST_KINDS, KERNEL_NAME_PATTERN, KERNEL_PREFIX
from kvcore.device.oplog import STREAM_KINDS as OP_KINDS
from reports.model import REPORT_SCHEMA
from harness.tools.scenario_schema import scenario_schema
from harness.tools.schema_words import (BOOLEAN, NAME, NAME_REGEX, SECONDS, SPAN, TEXT, Schema,
                                        array, closed, const, described, document, enum,
                                        integer, nullable, number, ref, string)

FOLDER = Path(__file__).resolve().parents[1] / "schemas"

EXPLORE_SCHEMA = "gpurace.explore/1"
"""What `gpurace explore --format json` writes as its ``schema`` (harness.cli.explore)."""



# ---- shared by the output documents ------------------------------------------------------------

def _opref() -> Schema:
    """harness.races.detector.OpRef.to_json: one side of a race."""
    return closed({
        "seq": integer(1), "stream": string(), "kind": string(), "step": nullable(string()),
        "site": nullable(string()), "origin": nullable(string()),
        "access": enum(["read", "write"]),
        "bytes": {"type": "array", "prefixItems": [integer(0), integer(0)], "items": False,
                  "minItems": 2, "description": "[first byte, end byte)"},
    })


def _finding(folded: bool) -> Schema:
    """harness.races.detector.Finding.to_json; a run's results fold them with ``trials``."""
    props = {
        "buffer": string(), "space": enum(["device", "host"]), "page": nullable(integer(0)),
        "owner": nullable(string()), "first_owner": nullable(string()), "reused": BOOLEAN,
        "first": ref("opref"), "second": ref("opref"),
        "missing": described(string(), "the missing edge, in words, with the fix that fits"),
        "count": described(integer(1), "op pairs of this shape in the trace"),
    }
    if folded:
        props["trials"] = described(integer(1), "trials it was found in")
    return closed(props)


def _xid_record() -> Schema:
    """An Xid a trial saw (harness.gpu.watch): NVML's or the kernel log's, or both."""
    return {"type": "object", "required": ["xid"],
            "properties": {"xid": integer(0), "meaning": nullable(string()),
                           "class": nullable(enum([APPLICATION, GPU_FATAL, "unknown"])),
                           "source": string(), "sources": array(string()),
                           "time": nullable(string()), "pid": nullable(integer()),
                           "line": nullable(string())}}


def _device() -> Schema:
    return described({"type": "object", "required": ["backend"],
                      "properties": {"backend": enum(["cuda", "sim"]), "name": string()}},
                     "what the trials ran on; its other keys depend on the backend")


def _health() -> Schema:
    return described({"type": "object",
                      "properties": {"available": BOOLEAN, "note": string()}},
                     "NVML's snapshot of the GPU (harness.gpu.nvml.health_snapshot), or why none")


def _trial() -> Schema:
    """harness.results.outcome.TrialResult.to_json."""
    return closed({
        "index": integer(0), "seed": integer(0), "outcome": enum(o.value for o in Outcome),
        "detail": string(), "cuda_error": nullable(string()), "step": nullable(string()),
        "requests": nullable(integer(0)), "duration_s": SECONDS, "race": BOOLEAN,
        "worker_pid": nullable(integer(0)), "device_log": string(),
        "trace": nullable(string()), "ops_total": integer(0),
        "xids": array(ref("xid")), "findings": array(ref("finding")),
        "reissued": described(BOOLEAN, "issued again from the device program an earlier clean "
                                       "trial captured, not step by step"),
    })


def _op_record(with_type: bool) -> Schema:
    """An op record of an op trace (report.json's last_ops drop its ``type``)."""
    kinds_on_streams = {"anyOf": [enum(sorted(OP_KINDS)), string(
        pattern=f"^{KERNEL_PREFIX}{KERNEL_NAME_PATTERN}$")]}
    props: dict[str, Schema] = {}
    if with_type:
        props["type"] = const("op")
    props.update({
        "seq": integer(1, L.COUNT_MAX),
        "stream": described(string(L.TEXT_MAX_CHARS, minLength=1),
                            f"a stream declared above, or {HOST!r} for the host's own actions"),
        "kind": string(L.TEXT_MAX_CHARS),
        "reads": array(SPAN, max_items=L.TRACE_MAX_ACCESSES),
        "writes": array(SPAN, max_items=L.TRACE_MAX_ACCESSES),
        "records": TEXT, "waits": TEXT, "syncs": TEXT, "step": TEXT,
        "t_issue_ns": integer(0, L.COUNT_MAX), "t_start_ns": integer(0, L.COUNT_MAX),
        "t_end_ns": integer(0, L.COUNT_MAX),
        "detail": {"type": "object", "properties": {
            "site": nullable(TEXT), "origin": nullable(TEXT), "range": SPAN, "name": TEXT,
            "done": BOOLEAN,
            "thread": described(TEXT, "the scenario's host thread that issued it"),
            "graph": described(TEXT, "the CUDA graph whose launch ran this node"),
            "node": described(TEXT, "the step that captured the node into its graph"),
            "captured_on": described(TEXT, "the stream the node's graph was captured from"),
            "launched_on": described(TEXT, "the stream the node's graph was launched on"),
            "branch": described(TEXT, "the stream that captured the node"),
            "launched": described(TEXT, "the scenario line that launched the graph")}},
    })
    owner = {"properties": {"detail": {"required": ["range"]}}, "required": ["detail"]}
    return closed(props, ["type", "seq", "stream", "kind"] if with_type else
                  ["seq", "stream", "kind"], allOf=[
        {"if": {"properties": {"stream": const(HOST)}},
         "then": {"properties": {"kind": enum(sorted(HOST_KINDS))}},
         "else": {"properties": {"kind": kinds_on_streams}}},
        {"if": {"properties": {"kind": enum(["alloc", "free"])}}, "then": owner},
        {"if": {"properties": {"kind": const("alloc")}},
         "then": {"properties": {"detail": {"required": ["range", "name"]}}}},
    ])


# ---- the documents -----------------------------------------------------------------------------

def run_schema() -> Schema:
    variant = closed({
        "scenario": NAME, "variant": NAME, "status": enum(s.value for s in Status),
        "expect": enum(EXPECTATIONS), "trials": integer(0),
        "wall_s": described(SECONDS, "the seconds its trials took, added up"),
        "manifested": integer(0),
        "manifested_interval": described(
            array(number(0, 1), min_items=2, max_items=2),
            "the Wilson 95% interval of the manifestation rate, [low, high]"),
        "detected": integer(0),
        "reproduced": described(integer(0), "trials that count as reproducing the race"),
        "not_clean": described(integer(0), "trials that manifested or had a race found"),
        "reissued": described(integer(0), "trials issued again from the device program an "
                                           "earlier clean trial captured"),
        "outcomes": closed({o.value: integer(0) for o in Outcome}),
        "reports": described(array(string()), "its incident folders"),
        "reason": string(), "path": string(), "dangerous": BOOLEAN, "amplified": BOOLEAN,
        "delay_us": nullable(number(0, L.DELAY_MAX_US)), "min_rate": number(0, 1),
        "sweep": BOOLEAN, "first_manifested": nullable(ref("trial")),
        "traces": array(string()), "crash_requests": array(integer(0)),
        "restart_s": described(array(number(0)),
                               "for each worker that died, the seconds until the next worker "
                               "was handed the remaining trials (a warm spare's hand-over)"),
        "xids": array(closed({"xid": integer(0), "meaning": nullable(string()),
                              "class": nullable(enum([APPLICATION, GPU_FATAL, "unknown"])),
                              "trials": integer(1)})),
        "findings": described(array(ref("folded-finding")),
                              "every race found, folded by the ops that raced, the most found "
                              "first"),
        "digest": described(string(pattern="^[0-9a-f]{64}$"),
                            "the sum modulo 2**256 of each trial's sha256 (index, seed, "
                            "outcome, detail): equal for runs, or merged shards, that made "
                            "the same trials"),
    })
    exits = [ExitCode.OK, ExitCode.EXPECTATION_FAILED, ExitCode.WRITE_FAILED,
             ExitCode.NOTHING_RAN, ExitCode.INTERRUPTED, ExitCode.TERMINATED]
    body = closed({
        "schema": const(RUN_SCHEMA), "run_id": string(), "folder": string(),
        "interrupted": described(string(pattern="^(SIG[A-Z0-9]+)?$"),
                                 "the signal that stopped the run, or empty"),
        "backend": enum(["cuda", "sim"]), "device": ref("device"), "seed": integer(),
        "poison": described(BOOLEAN, "released pages were poisoned (--poison)"),
        "wall_s": SECONDS, "exit_code": enum(int(c) for c in exits),
        "stopped": string(), "health": closed({"before": nullable(ref("health")),
                                               "after": nullable(ref("health"))}),
        "watch_notes": array(string()),
        "version": described(string(), "the gpurace that made the run"),
        "shard": described(nullable(closed({"index": integer(1, L.SHARDS_MAX),
                                            "count": integer(1, L.SHARDS_MAX)})),
                           "K of N with --shard K/N, else null"),
        "plan": described(nullable(closed({
            "digest": string(pattern="^[0-9a-f]{64}$"), "version": string(),
            "backend": enum(["cuda", "sim"]), "seed": integer(),
            "sources": described({"type": "object", "additionalProperties": string()},
                                 "each scenario's file sha256 (empty: none on disk)"),
        })), "what the shards of one run must share: gpurace merge compares it; null for "
            "`gpurace watch`, which runs no scenario"),
        "shards": described(array(closed({
            "index": integer(1), "count": integer(1), "path": string(), "run_id": string(),
            "folder": string(), "device": ref("device"),
            "health": closed({"before": nullable(ref("health")),
                              "after": nullable(ref("health"))}),
            "wall_s": SECONDS, "exit_code": integer()})),
            "a merged run's shard documents, empty for a run"),
        "lanes": described(array(string()),
                           "the GPUs (or simulated devices) its trials went to, side by side"),
        "retired": described(array(string()),
                             "GPUs a fatal Xid took out of the run, and why; the run exits 1"),
        "results": array(ref("variant")),
        "write_errors": described(array(closed({
            "what": string(), "path": string(), "error": string(), "count": integer(1)})),
            "files the run could not write (a full disk, its folder removed), a record per "
            "kind of file and reason, the first path and how many; any makes the run exit 4"),
        "watch_gaps": described(array(string()), "each time Xid watching stopped during the "
                                "run (the NVML helper died or hung and was started again, or "
                                "was given up; the kernel log became unreadable), in words"),
        "window": described(closed({
            "points": array(closed({
                "scenario": NAME, "variant": NAME, "delay_us": number(0, L.DELAY_MAX_US),
                "trials": integer(1), "manifested": integer(0), "rate": number(0, 1),
                "interval": array(number(0, 1), minItems=2, maxItems=2)})),
            "interpreter_gap_us": {"type": "object", "additionalProperties": number(0)},
        }), "a sweep's race window: the rate at each delay, and each scenario's measured "
            "host time from the delay's launch to the racing op (window.csv, window.png)"),
        "watch": described(closed({
            "command": string(),
            "runs": array(closed({
                "index": integer(0), "variant": described(NAME, "the amplified variant the "
                                                                "run belongs to"),
                "status": nullable(integer(0)),
                "signal": nullable(integer(1)), "timed_out": BOOLEAN,
                "error": nullable(string()), "ops": integer(0), "records": integer(0),
                "sources": {"type": "object", "additionalProperties": nullable(string())},
                "events": string(), "trace": string(), "log": string(),
                "start": described({"enum": ["fresh", "forked"]}, "a fresh interpreter, or "
                                   "forked from the fork server that imported the libraries "
                                   "the first run imported"),
                "duration_s": described(number(0), "seconds from the run's launch to its "
                                        "end, the launch included"),
                "launch_s": described(number(0), "of duration_s, the launch: a spawn or a "
                                      "fork, and for the run that started the fork server, "
                                      "the server's start (its imports)"),
                "capture": described({"type": "object", "additionalProperties": closed({
                    "source": string(), "ops": integer(0), "own_ns": integer(0),
                    "max_own_ns": integer(0), "max_site": nullable(string()),
                    "slow": array(array({}, 3, 3)),
                    "failures": {"type": "object", "additionalProperties": integer(1)}})},
                    "per source, what the capture cost the program: ops it handled, "
                    "nanoseconds of its own code over them all and on the costliest one "
                    "(at max_site), and what it could not read, counted"),
                "children": described(array(closed({
                    "pid": nullable(integer(0)), "role": string(), "events": string(),
                    "ops": integer(0), "findings": integer(0),
                    "trace": nullable(string())})),
                    "the run's Python children watched, each on its own (a spawned "
                    "multiprocessing worker, a Python subprocess): its pid, what it is, its "
                    "events file, the ops captured, and how many of the run's findings are "
                    "its, and its op trace (the part that held its race, on a long run)"),
                "analysis_error": described(string(), "how the analysis of this run (or of "
                                            "a child's) failed, a fault of gpurace's: the "
                                            "program ran on, unanalysed from there; the "
                                            "watch exits 3")},
                required=["index", "status", "signal", "timed_out", "error", "ops", "records",
                          "sources", "events", "trace", "log"])),
            "amplified": described(array(closed({
                "variant": NAME,
                "delays": array(closed({"path": string(), "line": integer(1),
                                        "us": number(0, L.DELAY_MAX_US),
                                        "kind": nullable(string()),
                                        "in_graph": described(BOOLEAN, "captured into "
                                                              "its CUDA graph: a race "
                                                              "between the graph's "
                                                              "branches")})),
                "first": nullable(string()), "second": nullable(string()),
                "stream": nullable(string()),
                "gap_us": described(nullable(number(0)), "the host's time from the first "
                                    "op's issue to the second's, in the run that found it"),
                "trials": integer(0), "failed": integer(0),
                "interval": array(number(0, 1)), "queued": integer(0)})),
                "--amplify: each plan's delays, the racing pair it opens (auto), how many "
                "of its runs failed, with the Wilson 95% interval, and the delays queued"),
        }, required=["command", "runs"]), "`gpurace watch`: the program's command, and how "
            "each run of it ended (its exit status or signal, the ops captured, its events, op "
            "trace and output)"),
    }, required=["schema", "run_id", "folder", "interrupted", "backend", "device", "seed",
                 "poison", "wall_s", "exit_code", "stopped", "health", "watch_notes",
                 "version", "shard", "plan", "shards", "lanes", "retired", "results"])
    return document(
        "gpurace run", f"run.json and `gpurace run --format json`: {RUN_SCHEMA}, a result per "
        "scenario variant (per delay in a sweep).", body,
        {"variant": variant, "trial": _trial(), "xid": _xid_record(),
         "finding": _finding(False), "folded-finding": _finding(True), "opref": _opref(),
         "device": _device(), "health": _health()})


def report_schema() -> Schema:
    body = closed({
        "schema": const(REPORT_SCHEMA),
        "created": string(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"),
        "scenario": closed({"name": NAME, "path": string(), "description": string(),
                            "dangerous": BOOLEAN}),
        "variant": closed({
            "name": NAME,
            "defects": described(ref("defects"), "kvcore's pool settings in this variant (a "
                                                 "scenario's; a watched program has none)"),
            "bugs": described(array(string()), "the known bugs switched on: the pool settings "
                                               "away from the correct pool's"),
            "expect": enum(EXPECTATIONS)}, required=["name", "expect"]),
        "trial": closed({"index": integer(0), "seed": integer(0), "duration_s": SECONDS,
                         "worker_pid": nullable(integer(0))}),
        "run_seed": integer(), "backend": enum(["cuda", "sim"]), "device": ref("device"),
        "health": {"type": "object", "properties": {
            "before": nullable(ref("health")), "after": nullable(ref("health")),
            "note": string()}},
        "outcome": described(enum(o.value for o in Outcome),
                             "clean when the trial only had a race detected"),
        "detail": string(), "cuda_error": nullable(string()), "step": nullable(string()),
        "request": described(nullable(integer(0)), "the request a workload crashed in"),
        "xids": array(ref("xid")), "xid_note": string(), "kernel_log": array(string()),
        "device_log": string(),
        "amplification": nullable(closed({"stream": nullable(string()),
                                          "before": nullable(string()),
                                          "delay_us": nullable(number(0, L.DELAY_MAX_US))})),
        "findings": array(ref("finding")),
        "last_ops": described(array(ref("op")), "the trial's last ops, as its trace has them"),
        "buffers": described({"type": "object", "additionalProperties": string()},
                             "the names of the buffers the last ops name, by buffer id"),
        "ops_total": integer(0),
        "trace": nullable(string()),
        "reproduce": closed({
            "command": string(), "argv": array(string(), min_items=1),
            "env": described({"type": "object", "additionalProperties": string()},
                             "environment the command needs: CUDA_VISIBLE_DEVICES naming the "
                             "GPU of a --gpus run's trial")}, required=["command", "argv"]),
        "files": described(array(string()), "what the incident folder holds"),
    })
    body["required"].remove("buffers")  # reports written before it still read
    return document(
        "gpurace incident report", f"An incident's report.json: {REPORT_SCHEMA}. gpurace's "
        "readers need only schema, scenario, variant, trial and outcome (reports.model), and "
        "accept bare values for the objects; this is the whole document gpurace writes.", body,
        {"defects": _defects(), "xid": _xid_record(), "finding": _finding(False),
         "opref": _opref(), "op": _op_record(with_type=False), "device": _device(),
         "health": _health()})


def _defects() -> Schema:
    return closed({name: BOOLEAN for name in kvcore.Defects.names()},
                  description="kvcore's known bugs, each switched on (true) or off")


def trace_record_schema() -> Schema:
    header = closed({
        "type": const("header"), "schema": const(TRACE_SCHEMA), "level": const("ops"),
        "scenario": TEXT, "path": TEXT, "variant": TEXT, "backend": TEXT,
        "defects": {"type": "object", "additionalProperties": BOOLEAN},
        "run_seed": integer(-L.SEED_MAX, L.SEED_MAX),
        "delay_us": nullable(number(0, L.DELAY_MAX_US)),
        "amplify": nullable(closed({"stream": nullable(string()),
                                    "before": nullable(string())})),
        "poison": described(BOOLEAN, "released pages were poisoned (--poison)"),
        "trial": integer(0, L.SEED_MAX), "seed": integer(0, L.SEED_MAX),
        "pid": integer(0, L.SEED_MAX),
        "part": described(integer(0, L.SEED_MAX), "a watched run's trace begun anew at a quiet "
                                                  "point: its part (the first has none)"),
    }, ["type", "schema"])
    buffer = closed({
        "type": const("buffer"), "id": integer(0, L.COUNT_MAX), "name": TEXT,
        "space": enum(["device", "host"]),
        "nbytes": integer(1, L.TRACE_MAX_BUFFER_BYTES), "role": TEXT,
        "page_bytes": integer(0, L.TRACE_MAX_BUFFER_BYTES),
    }, ["type", "id", "name", "space", "nbytes"])
    stream = closed({
        "type": const("stream"),
        "name": string(L.TEXT_MAX_CHARS, minLength=1, **{"not": const(HOST)}),
        "blocking": BOOLEAN, "legacy": BOOLEAN, "priority": integer(-(1 << 31), (1 << 31) - 1),
    }, ["type", "name", "blocking", "legacy"])
    label = closed({
        "type": const("label"), "buffer": integer(0, L.COUNT_MAX),
        "offset": integer(0, L.COUNT_MAX), "length": integer(0, L.COUNT_MAX), "name": TEXT,
    }, description="bytes that had an owner (a lease, a pinned buffer) when the trial began")
    times = closed({
        "type": const("times"),
        "ops": described(array({"type": "array", "prefixItems": [integer(1, L.COUNT_MAX),
                                                                   integer(0, L.COUNT_MAX),
                                                                   integer(0, L.COUNT_MAX)],
                                 "minItems": 3, "maxItems": 3}),
                         "[seq, t_start_ns, t_end_ns] of ops above: device times measured "
                         "once the trial ended (--timeline)"),
    }, ["type", "ops"])
    piece_op = _op_record(with_type=False)
    for key in ("seq", "t_issue_ns", "t_start_ns", "t_end_ns"):
        del piece_op["properties"][key]
    piece_op["required"] = ["stream", "kind"]
    program = closed({
        "type": const("program"), "id": integer(0, L.COUNT_MAX),
        "ops": described(array(piece_op, min_items=1, max_items=L.TRACE_MAX_PROGRAM_OPS),
                         "a piece of a reissued program: its ops as op records have them, "
                         "without seq and times"),
        "live": described(array(integer(0, L.TRACE_MAX_PROGRAM_OPS)),
                          "the ops whose detail takes a value from each run"),
    }, ["type", "id", "ops"])
    run = closed({
        "type": const("run"), "program": described(integer(0, L.COUNT_MAX),
                                                    "a program record above"),
        "seq": described(integer(1, L.COUNT_MAX), "the seq of the program's first op"),
        "t_issue_ns": described(integer(0, L.COUNT_MAX),
                                "the run's one issue time, its last op's"),
        "values": described(array(integer(0, 255)),
                            "the bytes the program's live ops set, in order"),
    }, ["type", "program", "seq"], description="the ops of a program record issued again")
    records = {"header": header, "buffer": buffer, "stream": stream, "label": label,
               "op": _op_record(with_type=True), "times": times, "program": program,
               "run": run}
    return document(
        "gpurace op trace record", f"One line of an op trace ({TRACE_SCHEMA}, JSON Lines): "
        "the header first, then buffer and stream records before their first use, label "
        "records, an op record per device-visible action in issue order, and with --timeline "
        "a times record giving ops their device times; a reissued trial's ops as program "
        "records (each piece once) and run records (each time it ran). What a schema "
        "cannot see of a line (declared before use, seq increasing, a range inside its "
        "buffer) `gpurace check` checks.",
        {"type": "object", "required": ["type"],
         "properties": {"type": enum(records)},
         "allOf": [{"if": {"properties": {"type": const(kind)}},
                    "then": ref(f"{kind}-record")} for kind in records]},
        {f"{kind}-record": schema for kind, schema in records.items()})


def ticket_record_schema() -> Schema:
    header = closed({
        "type": const("header"), "schema": const(TICKET_SCHEMA),
        "name": string(L.NAME_MAX_CHARS, pattern=NAME_REGEX), "description": TEXT,
        "lanes": integer(1, L.LANES_MAX), "page_tokens": integer(1, L.PAGE_MAX_TOKENS),
        "pool_pages": integer(1, L.POOL_MAX_PAGES),
        "kv": closed({"dtype": enum(KV_DTYPES), "leading": integer(1, L.PLANE_MAX_DIM),
                      "heads": integer(1, L.PLANE_MAX_DIM)}),
        "source": TEXT,
    }, ["type", "schema", "name", "lanes", "page_tokens", "pool_pages", "kv"])
    tokens = integer(0, L.TOKENS_MAX)
    request = closed({
        "type": const("request"), "id": integer(0, L.COUNT_MAX),
        "time_ms": number(0, L.TIME_MAX_MS), "lane": integer(0, L.LANES_MAX - 1),
        "conversation": string(L.NAME_MAX_CHARS, minLength=1),
        "turn": integer(1, L.REQUESTS_MAX), "prompt_tokens": tokens, "prefix_tokens": tokens,
        "new_tokens": described(tokens, "prompt_tokens - prefix_tokens"),
        "decode_tokens": tokens, "draft_tokens": tokens, "end": BOOLEAN,
    }, ["type", "id", "time_ms", "lane", "conversation", "turn", "prompt_tokens",
        "prefix_tokens", "new_tokens", "decode_tokens", "draft_tokens"])
    records = {"header": header, "request": request}
    return document(
        "gpurace ticket record", f"One line of a ticket ({TICKET_SCHEMA}, JSON Lines): the "
        "header first, then a request per line in time order. What a schema cannot see "
        "(ids and times increasing, a conversation's lane and turns, the pages fitting the "
        "pool) `gpurace replay` checks.",
        {"type": "object", "required": ["type"], "properties": {"type": enum(records)},
         "allOf": [{"if": {"properties": {"type": const(kind)}},
                    "then": ref(f"{kind}-record")} for kind in records]},
        {f"{kind}-record": schema for kind, schema in records.items()})


def list_schema() -> Schema:
    scenario = closed({"name": NAME, "kind": const("scenario"), "path": string(),
                       "description": string(), "dangerous": BOOLEAN,
                       "variants": array(NAME, min_items=1)})
    suite = closed({"name": NAME, "kind": const("suite"), "path": string(),
                    "description": string(), "scenarios": array(string(), min_items=1)})
    body = closed({
        "schema": const(LIST_SCHEMA),
        "documents": array({"oneOf": [ref("scenario"), ref("suite")]}),
        "broken": described(array(closed({"path": string(), "error": string()})),
                            "files that do not load, with the error"),
    })
    return document("gpurace list", f"`gpurace list --format json`: {LIST_SCHEMA}.", body,
                    {"scenario": scenario, "suite": suite})


def check_schema() -> Schema:
    body = closed({
        "schema": const(CHECK_SCHEMA), "trace": string(),
        "scenario": nullable(string()), "variant": nullable(string()),
        "findings": array(ref("finding")),
    })
    return document("gpurace check", f"`gpurace check --format json`: {CHECK_SCHEMA}, the race "
                    "detector's findings over one op trace.", body,
                    {"finding": _finding(False), "opref": _opref()})


def explore_schema() -> Schema:
    result = closed({
        "scenario": NAME, "variant": NAME, "strategy": enum(s.value for s in Strategy),
        "ops": integer(0), "decisions": integer(0), "tried": integer(0),
        "stop": enum(s.name.lower() for s in StopReason),
        "stop_reason": enum(s.value for s in StopReason),
        "failing": array(closed({
            "token": described(string(pattern=r"^s1-([0-9]+(\.[0-9]+)*)?(~[0-9]+\.[0-9]+)*$"),
                               "replay it with `gpurace run --backend sim --schedule TOKEN`"),
            "outcome": enum(o.value for o in Outcome if o.manifested), "detail": string()})),
    })
    body = closed({"schema": const(EXPLORE_SCHEMA), "met": BOOLEAN,
                   "results": array(ref("result"))})
    return document("gpurace explore", f"`gpurace explore --format json`: {EXPLORE_SCHEMA}.",
                    body, {"result": result})


BUILDERS = {
    "run": run_schema, "report": report_schema, "trace-record": trace_record_schema,
    "ticket-record": ticket_record_schema, "list": list_schema, "check": check_schema,
    "explore": explore_schema, "scenario": scenario_schema,
}


def schemas() -> dict[str, Schema]:
    """Every schema gpurace ships, by name."""
    return {name: build() for name, build in BUILDERS.items()}


def text(schema: Schema) -> str:
    """A schema as its file holds it."""
    return json.dumps(schema, indent=2) + "\n"


def write(folder: Path = FOLDER) -> list[Path]:
    """Write every schema into ``folder`` as NAME.schema.json; returns the files written."""
    written = []
    for name, schema in schemas().items():
        path = folder / f"{name}.schema.json"
        path.write_text(text(schema), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER):
        print(path)
