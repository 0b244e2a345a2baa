"""Property-based tests of the input contract (Hypothesis): generated documents, random ones and
mutations of the shipped files and of traces gpurace records, given to the loaders and to the
commands that read them.

Properties: a loader returns, or raises a ScenarioError, TraceError or TargetError whose message
starts with the file's path (one printable line); it does so within a time and memory bound;
what it accepts runs (a trial of every variant, in this process on the simulated device) without
any exception kvcore or the harness did not mean, since a worker that dies on one is exit 3;
the commands exit 0, 1, 2 or 77 and never print a traceback.

CI runs a modest number of examples (derandomized, so a run is repeatable). For a campaign:
``GPURACE_FUZZ_EXAMPLES=1200 python -m pytest tests/test_input_fuzz.py`` runs that many per
test with fresh randomness, and ``GPURACE_FUZZ_STATS=FILE`` appends one JSON line per example
(kind, seconds, outcome, peak memory) for the figures.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import re
import resource
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvcore
from harness.lang import vocabulary as V
from harness.cli import main
from harness.races.detector import check_trace
from harness.errors import ScenarioError, TargetError, TraceError
from harness.run.executor import TrialExecutor
from harness.lang.model import Scenario
from harness.run.replay import replay_scenario
from harness.lang.scenario import load_document, load_scenario, load_suite
from harness.traces.flight import FlightRecorder
from harness.traces.optrace import load_trace
from harness.traces.ticket import load_ticket

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
TICKET = SCENARIOS / "tickets" / "ninfer-210.jsonl"
SHIPPED = sorted([*SCENARIOS.glob("*.yaml"), *SCENARIOS.glob("zoo/*.yaml"),
                  *SCENARIOS.glob("suites/*.yaml")])

BIG = int(os.environ.get("GPURACE_FUZZ_EXAMPLES", "0") or 0)
STATS = os.environ.get("GPURACE_FUZZ_STATS")

LOAD_SECONDS = 1.0  # a loader refuses or accepts within this (what the contract promises)
RUN_SECONDS = 2.0  # a trial of each variant of an accepted document, in this process
MEMORY_BYTES = 256 << 20  # peak Python allocation while loading one example
CLI_SECONDS = 30.0  # a command, worker processes included (a hang: the watchdog's 2 s a variant)
RSS_KIB = 2 << 20  # this process and any worker at their largest: 2 GiB, a world of up to
# WORLD_MAX_BYTES (1 GiB) that a trial on the simulated device holds in memory, and Python


def fuzz(ci_examples: int) -> Callable[[Any], Any]:
    """Hypothesis settings: ``ci_examples`` in CI (derandomized: the same inputs each run),
    GPURACE_FUZZ_EXAMPLES with fresh randomness for a campaign. Time is checked by the tests
    themselves (generation excluded), so no deadline."""
    return settings(max_examples=BIG or ci_examples, derandomize=not BIG, database=None,
                    deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


def record(kind: str, seconds: float, outcome: str, peak: int = 0) -> None:
    """One line of campaign figures (with GPURACE_FUZZ_STATS)."""
    if not STATS:
        return
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(STATS, "a", encoding="utf-8") as file:
        file.write(json.dumps({"kind": kind, "seconds": round(seconds, 4), "outcome": outcome,
                               "peak": peak, "rss_kib": me, "children_rss_kib": children})
                   + "\n")


# ---- values that break things ------------------------------------------------------------------

EXTREME_NUMBERS = [b"0", b"-1", b"1", b"2", b"3", b"255", b"256", b"4096", b"65536", b"65537",
                   b"86401", b"2147484", b"200000000", b"9223372036854775808", b"1.0e+300",
                   b"-1.0e+300", b".inf", b"-.inf", b".nan", b"0.5", b"0x7fffffff", b"0o777",
                   b"9" * 5000, b"1_000_000", b"1:30", b"1e3"]
EXTREME_WORDS = [b"null", b"true", b"~", b"''", b'"\\e[31m"', b'"a\\nb"', b"x" * 70,
                 b"y" * 1100, b"[]", b"{}", b"[[[[", b"*a", b"&a x", b"!!binary aGk=",
                 b"!!python/object:os.system", b"<<: {a: 1}", b"? [a]", b"- ", b"|", b">-",
                 b"\t", b"%YAML 1.1", b"---", b"...", b"/dev/zero", b"../" * 40]
VOCABULARY = sorted({w.encode() for op, spec in V.OPS.items() for w in (op, *spec.keys)}
                    | {b"compute", b"transfer", b"legacy", b"buggy", b"fixed", b"pages",
                       b"table_rows", b"max_pages_per_row", b"timeout", b"trials", b"amplify",
                       b"delay_us", b"sweep", b"before", b"workload", b"conversation",
                       b"ticket", b"streams", b"blocking", b"non-blocking", b"Scenario",
                       b"Suite", b"variants", b"defects", b"release_fence", b"expect",
                       b"reproduces", b"clean", b"page_tokens", b"planes", b"align"})
JSON_EXTREMES: list[Any] = [0, -1, 1, 2, 3, 64, 65, 255, 1 << 31, 1 << 63, 1 << 64, 10 ** 30,
                            1e300, 0.5, -0.0, "", "x" * 70, "y" * 1100, "a\nb\u001b[31m",
                            None, True, False, [], {}, [1, 2, 3], [[1, 0, 4096]],
                            {"a": 1}, "/dev/zero", "gpurace.trace/2", "gpurace.ticket/1",
                            "host", "compute", "kernel:x", "copy_htod"]
JSON_EXTREME_TEXT = [b"9" * 5000, b"1e400", b"NaN", b"[" * 3000, b'{"a":' * 2000]


@st.composite
def text_mutations(draw: st.DrawFn, base: bytes, others: list[bytes]) -> bytes:
    """``base`` with one to four mutations: bytes flipped, spans cut or repeated, lines
    swapped, cut or borrowed from ``others``, numbers and words replaced by extreme ones."""
    data = base
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["number", "number", "word", "line", "swap", "dup", "cut",
                                    "flip", "insert", "truncate", "borrow"]))
        lines = data.split(b"\n")
        if how in ("number", "word"):
            pattern = rb"-?\d+(?:\.\d+)?" if how == "number" else rb"[A-Za-z_][A-Za-z0-9_-]*"
            spans = [m.span() for m in re.finditer(pattern, data)]
            if not spans:
                continue
            lo, hi = draw(st.sampled_from(spans))
            pool = EXTREME_NUMBERS if how == "number" else VOCABULARY + EXTREME_WORDS
            data = data[:lo] + draw(st.sampled_from(pool)) + data[hi:]
        elif how == "line" and lines:
            i = draw(st.integers(0, len(lines) - 1))
            lines[i] = draw(st.sampled_from(EXTREME_WORDS + EXTREME_NUMBERS))
            data = b"\n".join(lines)
        elif how == "swap" and len(lines) > 1:
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
        elif how == "dup" and lines:
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i] = [lines[i]] * draw(st.integers(1, 3))
            data = b"\n".join(lines)
        elif how == "cut" and data:
            lo = draw(st.integers(0, len(data) - 1))
            data = data[:lo] + data[lo + draw(st.integers(1, 64)):]
        elif how == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
        elif how == "insert":
            at = draw(st.integers(0, len(data)))
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        elif how == "truncate" and data:
            data = data[:draw(st.integers(0, len(data)))]
        elif how == "borrow" and others:
            source = draw(st.sampled_from(others)).split(b"\n")
            line = draw(st.sampled_from(source))
            lines.insert(draw(st.integers(0, len(lines))), line)
            data = b"\n".join(lines)
    return data


@st.composite
def json_line_mutations(draw: st.DrawFn, base: bytes) -> bytes:
    """JSON Lines ``base`` cut to a prefix of its lines (so a replay stays short), with up to
    four records changed: a field set to an extreme value, removed, added or renamed; a line
    replaced by text no JSON reader takes; or the bytes mutated as text."""
    lines = base.rstrip(b"\n").split(b"\n")
    lines = lines[:draw(st.integers(1, min(len(lines), 40)))]
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3, 4]))):
        i = draw(st.integers(0, len(lines) - 1))
        try:
            rec = json.loads(lines[i])
        except (ValueError, RecursionError):  # a line an earlier mutation made unreadable
            continue
        how = draw(st.sampled_from(["set", "set", "set", "drop", "add", "raw", "nest"]))
        if not isinstance(rec, dict) or not rec:
            continue
        key = draw(st.sampled_from(sorted(rec)))
        if how == "set":
            rec[key] = draw(st.sampled_from(JSON_EXTREMES))
        elif how == "drop":
            del rec[key]
        elif how == "add":
            rec[draw(st.sampled_from(["extra", "sead", "lanes", "x" * 80, key + "s"]))] = 1
        elif how == "nest" and isinstance(rec[key], dict) and rec[key]:
            inner = draw(st.sampled_from(sorted(rec[key])))
            rec[key][inner] = draw(st.sampled_from(JSON_EXTREMES))
        if how == "raw":
            text = json.dumps(rec)
            value = draw(st.sampled_from(JSON_EXTREME_TEXT))
            lines[i] = text.replace(json.dumps(rec[key]), value.decode(), 1).encode() \
                if not isinstance(rec[key], (dict, list)) else value
        else:
            lines[i] = json.dumps(rec).encode()
    data = b"\n".join(lines) + b"\n"
    if draw(st.integers(0, 5)) == 0:
        data = draw(text_mutations(data, []))
    return data


# ---- documents built to mostly load (so the deep checks get exercised) -------------------------

NAMES = ["a", "b", "c", "kv", "old", "new"]


@st.composite
def scenario_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A scenario whose steps mostly refer to what earlier steps made, with numbers around
    the pool's size: many load, and of those many ask kvcore for what it refuses, which the
    loader must refuse first."""
    variants = draw(st.lists(st.sampled_from(["buggy", "fixed", "other"]), min_size=1,
                             max_size=3, unique=True))
    pages = draw(st.sampled_from([1, 2, 2, 3, 4, 8]))
    pool: dict[str, Any] = {"pages": pages}
    if draw(st.booleans()):
        pool["table_rows"] = draw(st.sampled_from([1, 2, 4]))
    if draw(st.booleans()):
        pool["max_pages_per_row"] = draw(st.sampled_from([0, 1, 2, 4]))
    if draw(st.integers(0, 3)) == 0:
        pool["page_tokens"] = draw(st.sampled_from([1, 16, 64, 100]))
    if draw(st.integers(0, 3)) == 0:  # odd page sizes: strides that are no multiple of 256
        pool["planes"] = [{"dtype": draw(st.sampled_from(["i8", "f16", "f32"])),
                           "leading": draw(st.sampled_from([1, 3, 8])),
                           "heads": draw(st.sampled_from([1, 2])),
                           "align": draw(st.sampled_from([1, 4, 64, 256]))}
                          for _ in range(draw(st.integers(1, 2)))]
    declared = draw(st.integers(0, 2)) == 0
    streams = ["s1", "s2", "main"] if declared else ["compute", "transfer", "legacy", "stream"]
    made: dict[str, list[str]] = {"lease": [], "catalog": [], "buffer": [], "event": [],
                                  "graph": []}
    steps: list[dict[str, Any]] = []
    makers = {"lease": {"op": "materialize", "pages": 1}, "catalog": {"op": "catalog"},
              "buffer": {"op": "host_fill", "byte": 1}, "event": {"op": "record_event"},
              "graph": {"op": "graph_capture"}}
    for i in range(draw(st.integers(1, 14))):
        op = draw(st.sampled_from(list(V.OPS)))
        spec = V.OPS[op]
        groups = [keys for keys, _ in spec.one_of]
        chosen = {draw(st.sampled_from(keys)) for keys in groups}
        skip = {k for keys in groups for k in keys} - chosen
        keys = [key for key, k in spec.keys.items() if key not in skip and (
            k.required or key in chosen or draw(st.integers(0, 2)) == 0)]
        # What the step refers to and nothing made yet: make it first (mostly), so that
        # documents get past their references to the checks behind them.
        for key in keys:
            kind = V.REFERENCES.get(spec.keys[key].holds)
            kind = "lease" if kind == "memory" else kind  # a kernel's: a lease will do
            if kind and not made[kind] and draw(st.integers(0, 5)):
                maker = {**makers[kind], "id": f"m{i}-{kind}"}
                if kind == "buffer":
                    maker["buffer"] = f"b{i}"
                elif kind == "event":
                    maker.update(event=f"e{i}", stream=draw(st.sampled_from(streams)))
                elif kind == "graph":
                    maker.update(stream=draw(st.sampled_from(streams)))
                steps.append(maker)
                name = maker.get("buffer") or maker.get("event") or maker["id"]
                made[kind].append(name)
        step: dict[str, Any] = {"op": op}
        if spec.id_defines or draw(st.integers(0, 4)) == 0:
            step["id"] = f"s{i}"
        for key in keys:
            step[key] = draw(_value(spec.keys[key].holds, made, streams))
        if spec.at_most_one and all(k in step for k in spec.at_most_one):
            del step[spec.at_most_one[0]]
        if len(variants) > 1 and draw(st.integers(0, 3)) == 0:
            step[draw(st.sampled_from(["only", "unless"]))] = draw(st.sampled_from(variants))
        if op in ("lock", "unlock") or draw(st.integers(0, 5)) == 0:
            step[V.THREAD_KEY] = draw(st.sampled_from(["t1", "t2"]))
        steps.append(step)
        for kind, name in V.defines(op, step.get("id"), {k: v for k, v in step.items()
                                                         if k in spec.keys}):
            made[kind].append(name)
    spec_doc: dict[str, Any] = {"pool": pool, "trials": 1, "timeout": 5}
    if declared:
        spec_doc["streams"] = {"s1": "non-blocking", "s2": draw(st.sampled_from(
            ["non-blocking", "blocking"])), "main": "legacy"}
    spec_doc["variants"] = {v: {"defects": {d: draw(st.booleans())
                                            for d in kvcore.Defects.names()
                                            if draw(st.booleans())}} for v in variants}
    ids = [s["id"] for s in steps if "id" in s]
    if ids and draw(st.booleans()):
        spec_doc["amplify"] = {"delay_us": draw(st.sampled_from([0, 10, 1000])),
                               "before": draw(st.sampled_from(ids)),
                               "stream": draw(st.sampled_from(streams))}
    if draw(st.integers(0, 6)) == 0:
        spec_doc.pop("streams", None)
        spec_doc["workload"] = {"kind": "conversation", "requests": draw(st.integers(1, 6)),
                                "initial_pages": draw(st.integers(0, 3)),
                                "pages_per_turn": draw(st.integers(1, 2)),
                                "churn_pages": draw(st.integers(0, 2))}
        spec_doc.pop("amplify", None)
        if draw(st.booleans()):
            spec_doc["amplify"] = {"delay_us": 100, "stream": "legacy",
                                   "before": draw(st.sampled_from(["churn", "activate"]))}
    else:
        spec_doc["steps"] = steps
    return {"apiVersion": "gpurace/v1", "kind": "Scenario",
            "metadata": {"name": draw(st.sampled_from(["fuzz", "f-1", "x" * 64])),
                         "dangerous": draw(st.booleans())},
            "spec": spec_doc}


def _value(holds: str, made: dict[str, list[str]], streams: list[str]) -> st.SearchStrategy:
    def known(kind: str) -> st.SearchStrategy:
        if not made[kind]:
            return st.sampled_from(NAMES)
        # Mostly what was made; now and then a name nothing made.
        return st.one_of(st.sampled_from(made[kind]), st.sampled_from(made[kind]),
                         st.sampled_from(made[kind]), st.sampled_from(NAMES))

    small = st.sampled_from([1, 1, 1, 2, 2, 3, 4, 8])
    return {
        V.STREAM: st.sampled_from(streams),
        V.COUNT: small,
        V.INDEX: st.sampled_from([0, 1, 100, 1000, 4096]),
        V.PAGES: st.one_of(st.sampled_from([0, 1, 2, 3]),
                           st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=3)),
        V.BYTE: st.sampled_from([0, 1, 0xAB, 255]),
        V.DURATION: st.sampled_from([1, 10, 1000, 50000]),
        V.MICROS: st.sampled_from([1, 10, 1000, 50000]),
        V.BOOL: st.booleans(),
        V.LEASE: known("lease"), V.CATALOG: known("catalog"), V.BUFFER: known("buffer"),
        V.EVENT: known("event"),
        V.NEW_BUFFER: known("buffer"), V.ALLOC_BUFFER: st.sampled_from(NAMES),
        V.EVENTS: st.one_of(known("event"), st.lists(known("event"), min_size=1, max_size=2)),
        V.NEW_EVENT: known("event"),
        V.MUTEX: st.sampled_from(["m", "n"]),
        V.GRAPH: known("graph"),
        V.LIST: st.one_of(known("buffer"), known("lease")),
        V.MEMORY: st.one_of(known("lease"), known("buffer"),
                            st.lists(st.one_of(known("lease"), known("buffer")), min_size=1,
                                     max_size=3)),
    }[holds]


@st.composite
def ticket_docs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A small ticket that mostly keeps the rules (lanes, turns, ends), with token counts
    around the pool's size: many load, and some need more pages than the pool has."""
    lanes = draw(st.integers(1, 3))
    page_tokens = draw(st.sampled_from([1, 16, 64]))
    header = {"type": "header", "schema": "gpurace.ticket/1", "name": "fuzz", "lanes": lanes,
              "page_tokens": page_tokens, "pool_pages": draw(st.sampled_from([1, 2, 4, 8, 16])),
              "kv": {"dtype": draw(st.sampled_from(["i8", "f16"])), "leading": 8, "heads": 2}}
    state: dict[str, list[Any]] = {}  # conversation -> [lane, turn, ended]
    requests = []
    for i in range(draw(st.integers(0, 10))):
        conversation = draw(st.sampled_from(["a", "b", "c", "d", "e"]))
        lane, turn, ended = state.get(conversation, [draw(st.integers(0, lanes - 1)), 0, False])
        if ended and draw(st.integers(0, 4)):
            continue
        prompt = draw(st.sampled_from([0, 1, 10, 63, 64, 65, 200, 1000]))
        prefix = draw(st.sampled_from([0, 0, prompt // 2, prompt])) if turn else 0
        end = draw(st.integers(0, 3)) == 0
        requests.append({"type": "request", "id": i, "time_ms": float(i), "lane": lane,
                         "conversation": conversation, "turn": turn + 1,
                         "prompt_tokens": prompt, "prefix_tokens": prefix,
                         "new_tokens": prompt - prefix,
                         "decode_tokens": draw(st.sampled_from([0, 1, 4, 64])),
                         "draft_tokens": draw(st.sampled_from([0, 3])), "end": end})
        state[conversation] = [lane, turn + 1, end]
    return [header, *requests]


# ---- what gpurace writes, to mutate ------------------------------------------------------------


def _scratch(prefix: str) -> Path:
    """A folder the whole session's examples share (a fixture's would be made again for each
    example), removed when the session ends."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.lru_cache(maxsize=1)
def recorded_traces() -> tuple[bytes, ...]:
    """Op traces of a few trials, as the flight recorder writes them (the runner's header)."""
    folder = _scratch("gpurace-fuzz-traces-")
    traces = []
    sources = [(SCENARIOS / "cross_stream_race.yaml", "buggy"),
               (SCENARIOS / "zoo" / "mini_sglang_103.yaml", "fixed"),
               (SCENARIOS / "catalog_reactivation.yaml", "buggy")]
    for i, (path, name) in enumerate(sources):
        scenario = load_scenario(path)
        if scenario.workload is not None:
            scenario = _short(scenario)
        traces.append(_record(scenario, name, folder / str(i)))
    small = folder / "small-ticket.jsonl"
    small.write_bytes(b"\n".join(TICKET.read_bytes().split(b"\n")[:12]) + b"\n")
    replay = replay_scenario(small, ("publish_on_legacy_stream",))
    traces.append(_record(replay, replay.variants[0].name, folder / "replay"))
    return tuple(traces)


def _short(scenario: Scenario) -> Scenario:
    import dataclasses

    return dataclasses.replace(scenario, workload=dataclasses.replace(scenario.workload,
                                                                      requests=3))


def _record(scenario: Scenario, variant: str, folder: Path) -> bytes:
    recorder = FlightRecorder(folder)
    v = scenario.variant(variant)
    executor = TrialExecutor(scenario, v, "sim", on_device=recorder.attach)
    amp = scenario.amplify
    recorder.start_trial({"scenario": scenario.name, "path": str(scenario.path),
                          "variant": variant, "backend": "sim", "defects": v.defects.to_json(),
                          "run_seed": 0, "delay_us": amp.delay_us if amp else None,
                          "amplify": {"stream": amp.stream, "before": amp.before} if amp
                          else None, "trial": 0, "seed": 1, "pid": os.getpid()})
    executor.run(0, 1)
    return Path(recorder.end_trial(0, keep=True) or "").read_bytes()


SHIPPED_BYTES = [p.read_bytes() for p in SHIPPED]


def yaml_inputs() -> st.SearchStrategy[bytes]:
    """Scenario and suite files: mutations of the shipped ones, generated scenarios (as they
    are, and mutated), random YAML structures."""
    generated = scenario_docs().map(
        lambda d: yaml.safe_dump(d, sort_keys=False, default_flow_style=None).encode())
    structures = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                  st.text(max_size=20)),
        lambda inner: st.one_of(st.lists(inner, max_size=4),
                                st.dictionaries(st.text(max_size=10), inner, max_size=4)),
        max_leaves=30).map(lambda v: yaml.safe_dump(v).encode())
    shipped = st.integers(0, len(SHIPPED_BYTES) - 1).flatmap(
        lambda i: text_mutations(SHIPPED_BYTES[i], SHIPPED_BYTES))
    return st.one_of(shipped, generated, generated.flatmap(lambda b: text_mutations(b, [])),
                     structures)


def ticket_inputs() -> st.SearchStrategy[bytes]:
    base = TICKET.read_bytes()
    generated = ticket_docs().map(lambda recs: b"".join(json.dumps(r).encode() + b"\n"
                                                        for r in recs))
    return st.one_of(json_line_mutations(base), generated,
                     generated.flatmap(json_line_mutations))


def trace_inputs() -> st.SearchStrategy[bytes]:
    # By index: a failing example then names a trace, not every trace's bytes.
    count = len(recorded_traces())
    return st.integers(0, count - 1).flatmap(
        lambda i: json_line_mutations(recorded_traces()[i]))


# ---- the properties ------------------------------------------------------------------------


def _load(load: Callable[[Path], Any], path: Path, kind: str) -> Any:
    """Load ``path``: it returns, or raises an error of the contract that starts with the
    path; within LOAD_SECONDS and MEMORY_BYTES. Returns what it loaded, or None."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        loaded = load(path)
        outcome = "accepted"
    except (ScenarioError, TraceError, TargetError) as exc:
        message = str(exc)
        loaded, outcome = None, "refused"
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    record(kind, seconds, outcome, peak)
    assert seconds < LOAD_SECONDS, f"{kind} took {seconds:.2f} s"
    assert peak < MEMORY_BYTES, f"{kind} peaked at {peak:,} bytes"
    if loaded is None:
        assert message.startswith(f"{path}:"), message
        assert message.isprintable(), message
    return loaded


def _runs(scenario: Scenario, kind: str) -> None:
    """A trial of each variant of what was accepted runs, in this process, on sim, without an
    exception (a worker dies on one: exit 3). A step that never ends is the watchdog's."""
    if any(s.op == "delay" and math.isinf(float(s.args["us"])) for s in scenario.steps):
        return  # type: ignore[arg-type]
    start = time.perf_counter()
    for variant in scenario.variants:
        TrialExecutor(scenario, variant, "sim").run(0, 1)
    seconds = time.perf_counter() - start
    record(f"{kind}-run", seconds, "ran")
    assert seconds < RUN_SECONDS * len(scenario.variants), f"the trials took {seconds:.2f} s"


@fuzz(100)
@given(data=yaml_inputs())
def test_scenario_loader(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.getbasetemp() / "fuzz.yaml"
    path.write_bytes(data)
    loaded = _load(load_document, path, "scenario")
    if isinstance(loaded, Scenario):
        _runs(loaded, "scenario")


SUITES = [p.read_bytes() for p in SHIPPED if p.parent.name == "suites"]
MEMBERS = ["../release_fence.yaml", "../zoo/cupy_8789.yaml", "../zoo/vllm_36013.yaml",
           "../missing.yaml", "fuzz.yaml", "../suites/other.yaml", "", "/dev/zero", "..",
           "x" * 300, "a\0b"]


@st.composite
def suite_docs(draw: st.DrawFn) -> bytes:
    """A suite listing some of: shipped scenarios, files that are not there, itself, another
    suite, odd paths."""
    members = draw(st.lists(st.sampled_from(MEMBERS + MEMBERS[:3] * 6), min_size=0,
                            max_size=5, unique=True))
    return yaml.safe_dump({"apiVersion": "gpurace/v1", "kind": "Suite",
                           "metadata": {"name": "fuzz"},
                           "spec": {"scenarios": members}}).encode()


def suite_inputs() -> st.SearchStrategy[bytes]:
    shipped = st.integers(0, len(SUITES) - 1).flatmap(
        lambda i: text_mutations(SUITES[i], SUITES))
    return st.one_of(suite_docs(), suite_docs().flatmap(lambda b: text_mutations(b, [])),
                     shipped, yaml_inputs())


@functools.lru_cache(maxsize=1)
def suite_folder() -> Path:
    """A copy of the scenarios' layout (links to them) where a suite's paths resolve."""
    root = _scratch("gpurace-fuzz-suites-")
    for path in SCENARIOS.iterdir():
        if path.name != "suites":
            (root / path.name).symlink_to(path)
    (root / "suites").mkdir()
    (root / "suites" / "other.yaml").write_bytes(SUITES[0])
    return root / "suites"


@fuzz(60)
@given(data=suite_inputs())
def test_suite_loader(data: bytes) -> None:
    path = suite_folder() / "fuzz.yaml"
    path.write_bytes(data)
    _load(load_suite, path, "suite")


@fuzz(80)
@given(data=ticket_inputs(), defects=st.sets(st.sampled_from(kvcore.Defects.names())))
def test_ticket_loader(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                       defects: set[str]) -> None:
    path = tmp_path_factory.getbasetemp() / "fuzz-ticket.jsonl"
    path.write_bytes(data)
    ticket = _load(load_ticket, path, "ticket")
    if ticket is not None and len(ticket.requests) <= 40:
        _runs(replay_scenario(path, tuple(sorted(defects))), "ticket")


@fuzz(80)
@given(data=trace_inputs())
def test_trace_loader(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.getbasetemp() / "fuzz-trace.jsonl"
    path.write_bytes(data)
    trace = _load(load_trace, path, "trace")
    if trace is not None:
        start = time.perf_counter()
        check_trace(trace.records)
        seconds = time.perf_counter() - start
        record("trace-check", seconds, "checked")
        assert seconds < LOAD_SECONDS


def _cli(args: list[str], kind: str) -> None:
    start = time.perf_counter()
    result = CliRunner().invoke(main, args)
    seconds = time.perf_counter() - start
    record(kind, seconds, f"exit {result.exit_code}")
    assert result.exit_code in (0, 1, 2, 77), (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exception
    assert "Traceback" not in result.output and "internal error" not in result.output, \
        result.output
    assert seconds < CLI_SECONDS, f"{args[0]} took {seconds:.1f} s"
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        assert resource.getrusage(who).ru_maxrss < RSS_KIB


@fuzz(8)
@given(data=yaml_inputs(), dangerous=st.booleans())
def test_cli_run(tmp_path_factory: pytest.TempPathFactory, data: bytes, dangerous: bool) -> None:
    base = tmp_path_factory.getbasetemp()
    path = base / "cli.yaml"
    path.write_bytes(data)
    _cli(["run", str(path), "--backend", "sim", "--trials", "1", "--timeout", "2", "--out",
          str(base / "cli-out"), *(["--dangerous"] if dangerous else [])], "cli-run")


@fuzz(6)
@given(data=ticket_inputs(), defect=st.sampled_from([[], ["--defect",
                                                          "publish_on_legacy_stream",
                                                          "--dangerous"]]))
def test_cli_replay(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                    defect: list[str]) -> None:
    base = tmp_path_factory.getbasetemp()
    path = base / "cli-ticket.jsonl"
    path.write_bytes(data)
    _cli(["replay", str(path), "--backend", "sim", "--timeout", "20", *defect, "--out",
          str(base / "cli-out")], "cli-replay")


@fuzz(25)
@given(data=trace_inputs())
def test_cli_check(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.getbasetemp() / "cli-trace.jsonl"
    path.write_bytes(data)
    _cli(["check", str(path)], "cli-check")


@fuzz(6)
@given(data=st.one_of(trace_inputs(), ticket_inputs()),
       defect=st.sampled_from([[], ["--defect", "publish_on_legacy_stream"],
                               ["--defect", "release_fence"]]))
def test_cli_minimize(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                      defect: list[str]) -> None:
    base = tmp_path_factory.getbasetemp()
    path = base / "cli-min.jsonl"
    path.write_bytes(data)
    out = base / "cli-min.yaml"
    out.unlink(missing_ok=True)
    _cli(["minimize", str(path), "-o", str(out), *defect], "cli-minimize")
