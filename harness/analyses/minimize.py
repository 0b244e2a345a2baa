"""Minimize a failure to the smallest scenario that still fails: delta debugging.

From an incident, an op trace (whose header says how its trial ran) or a ticket with the defects
to switch on, the failure is first shrunk at the request level (which requests of a ticket it
needs; how many turns of the conversation workload), then turned into the kvcore steps those
requests perform, and shrunk again at the step level, keeping every step that a kept step depends
on (the materialize of a lease it uses, the catalog it names, the host buffer it reads). Each
candidate runs one trial on the simulated device with the race detector on; it "still fails"
when it ends the same way (crash, corruption) or, for a race that did not manifest, when the
detector finds the same race. The result is a scenario file that `gpurace run` accepts.

What minimize reads is input like any other: the incident's report, the op trace's header, and
the scenario or ticket either names (a path inside them is followed only to a regular file, read
through the same bounded reader as every input); a field it cannot use is a TargetError naming
the file and the field, never a traceback.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import kvcore
from harness.traces import batching
from harness.lang import vocabulary as V
from harness.races.detector import RaceDetector, check_trace
from harness.errors import ScenarioError, TargetError, TraceError
from harness.run.executor import TrialExecutor
from harness.run.workloads import pool_for
from harness.limits import (
    DELAY_MAX_US,
    HEAD_BYTES,
    NAME_MAX_CHARS,
    REPORT_MAX_BYTES,
    SEED_MAX,
    TEXT_MAX_CHARS,
)
from harness.lang.model import Amplify, PoolSpec, Scenario, Step, Variant, Workload
from harness.traces.optrace import is_op_trace, load_trace
from harness.results.outcome import Outcome
from harness.run.replay import replay_scenario
from harness.inputs import Unreadable, clip, echo, plain, read_input, show_path
from harness.lang.scenario import is_file, load_scenario
from harness.traces.jsonl import column_of
from harness.traces.ticket import Request, Ticket, load_ticket, write_ticket
from reports import load_report, write_atomic

@dataclass(frozen=True)
class Failure:
    """How the original failed: what a candidate must reproduce."""

    outcome: Outcome | None  # a manifestation (crash, corruption, hang), or None
    race: tuple[str, str, str, str, str] | None  # (buffer, first stream/kind, second ...)

    def matches(self, outcome: Outcome, findings: Sequence[dict[str, Any]]) -> bool:
        if self.outcome is not None:
            return outcome is self.outcome
        return any(_race_key(f) == self.race for f in findings)

    def describe(self) -> str:
        if self.outcome is not None:
            return f"ends in {self.outcome.value}"
        assert self.race is not None
        return (f"races on {self.race[0]}: {self.race[1]} {self.race[2]} vs {self.race[3]} "
                f"{self.race[4]}")


def _race_key(finding: dict[str, Any]) -> tuple[str, str, str, str, str]:
    first, second = finding["first"], finding["second"]
    return (finding["buffer"], first["stream"], first["kind"], second["stream"],
            second["kind"])


@dataclass
class Minimized:
    scenario_text: str
    steps: int
    requests_from: int | None
    requests_kept: int | None
    steps_from: int
    failure: Failure
    tries: int


class _Judge:
    """Runs candidates: one sim trial each, detector on, with the original's amplification.
    A candidate fails when its failing variant fails the same way AND every variant of the
    scenario expected to stay clean stays clean (with no variant that expects it, the failing
    one with no defect): otherwise the candidate shows some other bug (a read of a row nobody
    wrote, say), or has lost the fix, not this one."""

    def __init__(self, variant: Variant, clean: tuple[Variant, ...], failure: Failure,
                 how: HowRun) -> None:
        self.variant = variant
        self.clean = clean or (dataclasses.replace(variant, defects=kvcore.Defects()),)
        self.failure = failure
        self.how = how
        self.tries = 0

    def fails(self, scenario: Scenario) -> bool:
        self.tries += 1
        buggy = self._run(scenario, self.variant)
        if buggy is None or not self.failure.matches(*buggy):
            return False
        for variant in self.clean:
            fixed = self._run(scenario, variant)
            if fixed is None or fixed[0] is not Outcome.CLEAN or fixed[1]:
                return False
        return True

    def _run(self, scenario: Scenario,
             variant: Variant) -> tuple[Outcome, list[dict[str, Any]]] | None:
        try:
            return sim_trial(scenario, variant, self.how)
        except (kvcore.KVCoreError, KeyError, IndexError, ValueError):
            return None  # a candidate that cannot even run (pool exhausted, a dangling name)


@dataclass(frozen=True)
class HowRun:
    """How the failing trial ran, and so how every candidate runs: its amplification, its seed
    and whether released pages were poisoned."""

    amplified: bool
    delay_us: float | None
    seed: int
    poison: bool = False


def sim_trial(scenario: Scenario, variant: Variant,
              how: HowRun) -> tuple[Outcome, list[dict[str, Any]]]:
    """One sim trial with the detector on: its outcome and its findings."""
    detector = RaceDetector()
    executor = TrialExecutor(scenario, variant, "sim", amplify=how.amplified,
                             delay_us=how.delay_us, poison=how.poison,
                             on_device=detector.attach)
    result = executor.run(0, how.seed)
    return result.outcome, [f.to_json() for f in detector.findings]


def ddmin(items: list[Any], fails: Callable[[list[Any]], bool]) -> list[Any]:
    """Zeller's delta debugging: a 1-minimal sublist of ``items`` for which ``fails`` holds."""
    n = 2
    while len(items) >= 2:
        chunk = -(-len(items) // n)
        parts = [items[i:i + chunk] for i in range(0, len(items), chunk)]
        for i in range(len(parts)):
            complement = [x for j, part in enumerate(parts) if j != i for x in part]
            if fails(complement):
                items, n = complement, max(n - 1, 2)
                break
        else:
            if n >= len(items):
                break
            n = min(len(items), n * 2)
    return items


# ---- requests -> steps ---------------------------------------------------------------------------
def _renumbered(requests: Sequence[Request]) -> list[Request]:
    """A kept subset as a valid ticket: ids and turns renumbered, each turn's prefix no longer
    than its prompt."""
    turns: dict[str, int] = {}
    out = []
    for i, r in enumerate(requests):
        turns[r.conversation] = turns.get(r.conversation, 0) + 1
        prefix = min(r.prefix_tokens, r.prompt_tokens) if turns[r.conversation] > 1 else 0
        out.append(dataclasses.replace(r, id=i, turn=turns[r.conversation], prefix_tokens=prefix,
                                       new_tokens=r.prompt_tokens - prefix))
    ends = {r.conversation: i for i, r in enumerate(out)}
    return [dataclasses.replace(r, end=r.end and ends[r.conversation] == i)
            for i, r in enumerate(out)]


def steps_for(ticket: Ticket) -> list[dict[str, Any]]:
    """The kvcore steps the replay engine performs for ``ticket`` (its batching plan), in the
    scenario vocabulary; each conversation gets a catalog of its own (and a table row: see
    :func:`_pool_for_steps`)."""
    steps: list[dict[str, Any]] = []
    leases: dict[str, list[str]] = {}
    decodes: dict[int, int] = {}
    ids = _catalog_ids(ticket)
    widest = 1
    for step in batching.plan(ticket):
        for work in step.work:
            n, conversation = work.number, work.request.conversation
            cat = ids[conversation]
            if work.opens:
                leases[conversation] = []
                steps += [{"id": cat, "op": "catalog"}, {"op": "bind", "catalog": cat}]
            if work.new_pages:
                lease = f"r{n}-pages"
                widest = max(widest, work.new_pages)
                steps += [{"id": lease, "op": "materialize", "pages": work.new_pages},
                          {"op": "copy_from_host", "src": "kv", "dst": lease,
                           "stream": "compute"},
                          {"op": "retain", "catalog": cat, "lease": lease}]
                leases[conversation].append(lease)
            if work.activate:
                steps.append({"id": f"r{n}-activate", "op": "activate", "catalog": cat,
                              "stream": "compute"})
            decodes[n] = decodes.get(n, 0) + 1
            suffix = "" if decodes[n] == 1 else str(decodes[n])
            steps.append({"id": f"r{n}-decode{suffix}", "op": "read_table", "catalog": cat,
                          "stream": "compute"})
        steps.append({"op": "synchronize", "stream": "compute"})
        for conversation in step.releases:
            steps += [{"op": "release", "lease": lease} for lease in leases.pop(conversation)]
    return [{"op": "host_fill", "buffer": "kv", "byte": 0x5A, "pages": widest}, *steps]


def _catalog_ids(ticket: Ticket) -> dict[str, str]:
    """A step id for each conversation's catalog: ``conv-`` and its name, made a valid name (a
    ticket's conversation names are any text), numbered when two would be the same."""
    ids: dict[str, str] = {}
    taken: set[str] = set()
    for i, name in enumerate(ticket.conversations(), 1):
        slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")[:40] or "c"
        cat = f"conv-{slug}"
        if cat in taken:
            cat = f"{cat}-{i}"
        taken.add(cat)
        ids[name] = cat
    return ids


def _pool_for_steps(ticket: Ticket) -> PoolSpec:
    """The ticket's pool, with a table row for every conversation: as steps, each binds a row
    of its own (the replay engine reuses a lane's row for the lane's next conversation)."""
    pool = pool_for(ticket)
    return dataclasses.replace(pool, table_rows=max(pool.table_rows,
                                                    len(ticket.conversations())))


def conversation_steps(workload: Workload) -> list[dict[str, Any]]:
    """The kvcore steps of the conversation workload, in the scenario vocabulary: a retained
    catalog, then per request the churn lane's pages, the turn's new pages, the activation and
    the decode's table read (what the executor's conversation does, one step each)."""
    steps: list[dict[str, Any]] = [
        {"op": "host_fill", "buffer": "kv", "byte": 0x5A,
         "pages": max(workload.initial_pages, workload.pages_per_turn, workload.churn_pages)},
        {"id": "conversation", "op": "catalog"}]
    # A count of 0 (no initial pages, no churn lane) is no step: a step takes 1 page or more.
    if workload.initial_pages:
        steps += [{"id": "initial", "op": "materialize", "pages": workload.initial_pages},
                  {"op": "copy_from_host", "src": "kv", "dst": "initial", "stream": "compute"},
                  {"op": "retain", "catalog": "conversation", "lease": "initial"}]
    steps.append({"op": "bind", "catalog": "conversation"})
    for n in range(1, workload.requests + 1):
        churn, fresh = f"r{n}-churn", f"r{n}-pages"
        if workload.churn_pages:
            steps += [{"id": churn, "op": "materialize", "pages": workload.churn_pages},
                      {"op": "copy_from_host", "src": "kv", "dst": churn,
                       "stream": "transfer"},
                      {"op": "release", "lease": churn}]
        steps += [{"id": fresh, "op": "materialize", "pages": workload.pages_per_turn},
                  {"op": "copy_from_host", "src": "kv", "dst": fresh, "stream": "compute"},
                  {"op": "retain", "catalog": "conversation", "lease": fresh},
                  {"id": f"r{n}-activate", "op": "activate", "catalog": "conversation",
                   "stream": "compute"},
                  {"id": f"r{n}-decode", "op": "read_table", "catalog": "conversation",
                   "stream": "compute"},
                  {"op": "synchronize", "stream": "compute"}]
    return steps


def _doubling(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``, and ``limit`` itself: request counts to try, smallest first."""
    counts = []
    n = 1
    while n < limit:
        counts.append(n)
        n *= 2
    return [*counts, limit]


def _closure(steps: list[dict[str, Any]], variants: Sequence[str]) -> list[dict[str, Any]]:
    """Drop every step that, in some variant it runs in, uses a name no kept step of that
    variant made, or made and gave back (cascading)."""
    while True:
        live: dict[str, set[tuple[str, str]]] = {v: set() for v in variants}
        kept = []
        for step in steps:
            runs = [v for v in variants if _runs_in(step, v)]
            args = _args(step)
            if all(use in live[v] for v in runs for use in V.uses(step["op"], args)):
                kept.append(step)
                gone = V.frees(step["op"], args)
                made = set(V.defines(step["op"], step.get("id"), args))
                # A kernel's memory is a lease or a buffer: each is one under that name too.
                made |= {("memory", name) for kind, name in made if kind in V.MEMORY_KINDS}
                for v in runs:
                    live[v] |= made
                    live[v].discard(gone)  # type: ignore[arg-type]
                    if gone is not None:
                        live[v].discard(("memory", gone[1]))
        if len(kept) == len(steps):
            return kept
        steps = kept


def _runs_in(step: dict[str, Any], variant: str) -> bool:
    only = step.get("only")
    return only is None or variant == only or (isinstance(only, list) and variant in only)


def _args(step: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in step.items() if k not in ("id", "op", "only", "thread")}


def _as_steps(raw: list[dict[str, Any]]) -> tuple[Step, ...]:
    return tuple(Step(op=s["op"], args=_args(s), id=s.get("id"), index=i,
                      only=None if "only" not in s else frozenset(
                          [s["only"]] if isinstance(s["only"], str) else s["only"]),
                      thread=s.get("thread"))
                 for i, s in enumerate(raw))


def _raw(steps: Sequence[Step]) -> list[dict[str, Any]]:
    return [{**({"id": s.id} if s.id else {}), "op": s.op, **s.args,
             **({"only": _only(s.only)} if s.only is not None else {}),
             **({"thread": s.thread} if s.thread is not None else {})} for s in steps]


def _only(variants: frozenset[str]) -> str | list[str]:
    """A step's variants as a person writes them: one name, or a list."""
    return next(iter(variants)) if len(variants) == 1 else sorted(variants)


# ---- the whole pipeline ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Origin:
    """What to minimize: a scenario, the variant that fails, how the failing trial ran, and
    the failure to keep."""

    scenario: Scenario
    variant: Variant
    how: HowRun
    failure: Failure


def minimize(source: Path, *, defects: tuple[str, ...] = (), amplify: bool | None = None,
             progress: Callable[[str], None] | None = None) -> Minimized:
    """Minimize the failure of an incident folder (or report.json), of an op trace (a trial
    recorded by the flight recorder), or of a ticket replayed with ``defects``."""
    say = progress or (lambda _: None)
    if source.is_dir() or source.name == "report.json":
        origin = _from_incident(source, amplify)
    elif is_op_trace(source):
        origin = _from_op_trace(source, amplify)
    else:
        origin = _from_ticket(source, defects, amplify)
    scenario, variant, failure = origin.scenario, origin.variant, origin.failure
    amplified = origin.how.amplified
    # A step scenario keeps its own variants (a fix written as steps must stay clean); a
    # workload's or a ticket's steps are judged against the failing variant with no defect.
    own_variants = scenario.workload is None
    clean = tuple(v for v in scenario.variants if v.expect == "clean") if own_variants else ()
    judge = _Judge(variant, clean, failure, origin.how)
    names = [v.name for v in scenario.variants]
    say(f"the failure to keep: it {failure.describe()}")

    requests_from = requests_kept = None
    if scenario.workload is not None and scenario.workload.ticket is not None:
        ticket = load_ticket(scenario.workload.ticket)
        requests_from = len(ticket.requests)
        with tempfile.TemporaryDirectory(prefix="gpurace-min-") as tmp:
            def ticket_fails(kept: list[Request]) -> bool:
                candidate = Ticket(ticket.header, tuple(_renumbered(kept)))
                file = Path(tmp) / f"t{judge.tries}.jsonl"
                try:
                    write_ticket(candidate, file)
                except TraceError:
                    # Dropping a conversation's last request keeps its pages for good: such a
                    # subset may overrun the pool, which the loader refuses. No answer.
                    return False
                return judge.fails(replay_scenario(file, variant.defects.active()))

            if not ticket_fails(list(ticket.requests)):
                raise TargetError(f"{source}: replayed on the simulated device, it no longer "
                                  f"{failure.describe()}; nothing to minimize")
            kept = ddmin(list(ticket.requests), ticket_fails)
        requests_kept = len(kept)
        say(f"requests: {requests_from} -> {requests_kept}")
        small = Ticket(ticket.header, tuple(_renumbered(kept)))
        raw = steps_for(small)
        base = dataclasses.replace(scenario, pool=_pool_for_steps(small), workload=None,
                                   steps=_as_steps(raw), replay_defects=None,
                                   amplify=_step_amplify(scenario.amplify, raw))
    elif scenario.workload is not None:
        # The conversation workload's requests are all alike: what matters is how many it takes.
        workload = scenario.workload
        requests_from = workload.requests
        requests_kept = next((n for n in _doubling(workload.requests) if judge.fails(
            dataclasses.replace(scenario, workload=dataclasses.replace(workload, requests=n)))),
            None)
        if requests_kept is None:
            raise TargetError(f"{source}: run again on the simulated device, it no longer "
                              f"{failure.describe()}; nothing to minimize")
        say(f"requests: {requests_from} -> {requests_kept}")
        raw = conversation_steps(dataclasses.replace(workload, requests=requests_kept))
        base = dataclasses.replace(scenario, workload=None, steps=_as_steps(raw),
                                   amplify=_step_amplify(scenario.amplify, raw))
    else:
        raw = _raw(scenario.steps)
        base = scenario

    steps_from = len(raw)

    def steps_fail(candidate: list[dict[str, Any]]) -> bool:
        closed = _closure(candidate, names)
        amp = _step_amplify(base.amplify, closed) if amplified else base.amplify
        if amplified and base.amplify is not None and amp is None:
            return False  # the amplified step is gone; the failure would only show by luck
        scenario = dataclasses.replace(base, steps=_as_steps(closed), amplify=amp)
        # What the loader refuses (a buffer allocated twice, freed twice...) is no answer.
        if not _loads(_yaml(scenario, variant, source, failure, own_variants)):
            return False
        return judge.fails(scenario)

    if not steps_fail(raw):
        raise TargetError(f"{source}: run as steps on the simulated device, it no longer "
                          f"{failure.describe()}; nothing to minimize")
    raw = _closure(ddmin(raw, steps_fail), names)
    raw = _shrink_counts(raw, steps_fail)
    say(f"steps: {steps_from} -> {len(raw)}")
    final = dataclasses.replace(base, steps=_as_steps(raw),
                                amplify=_step_amplify(base.amplify, raw) if amplified else None)
    return Minimized(_yaml(final, variant, source, failure, own_variants), len(raw),
                     requests_from, requests_kept, steps_from, failure, judge.tries)


def _from_incident(source: Path, amplify: bool | None) -> _Origin:
    file = source / "report.json" if source.is_dir() else source
    if file.exists():
        # Through the one reader first: a report.json that is a pipe or a device, or too
        # large, is refused before anything reads it.
        try:
            read_input(file, REPORT_MAX_BYTES, "a report", head=False)
        except Unreadable as exc:
            raise TargetError(f"{file}:1:1: (file): {exc}") from None
    report = load_report(source)
    argv = _field(report, "reproduce.argv", list, file, [])
    amp = _field(report, "amplification", dict, file, None)
    delay = None if amp is None else _field(report, "amplification.delay_us", float, file, None)
    path = Path(_field(report, "scenario.path", str, file))
    replayed = len(argv) > 1 and argv[1] == "replay"
    defects = _field(report, "variant.defects", dict, file)
    scenario = _scenario_at(path, replayed, defects, f"{file}: scenario.path")
    variant = _variant(scenario, _field(report, "variant.name", str, file),
                       f"{file}: variant.name")
    how = HowRun(amp is not None if amplify is None else amplify, delay,
                  _field(report, "trial.seed", int, file), poison="--poison" in argv)
    return _Origin(scenario, variant, how, _failure(report, file))


def _field(report: dict[str, Any], key: str, kind: type, file: Path,
           default: Any = ...) -> Any:
    """``report[a][b]`` for ``key`` ``a.b``, of type ``kind`` (a float may be written as an
    integer); ``default`` when it is missing (or null), if given."""
    value: Any = report
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None and default is not ...:
        return default
    ok = isinstance(value, kind) and not isinstance(value, bool) if kind in (int, float) \
        else isinstance(value, kind)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if kind is float and ok and not (0 <= value <= DELAY_MAX_US and math.isfinite(value)):
        ok = False
    if kind is int and ok and not 0 <= value <= SEED_MAX:
        ok = False
    if not ok:
        raise TargetError(f"{file}: {key}: {'missing' if value is None else echo(value)}, "
                          f"not what gpurace writes there; the report is damaged: run the "
                          "trial again for a new one")
    return value


def _from_op_trace(source: Path, amplify: bool | None) -> _Origin:
    trace = load_trace(source)
    header = trace.header
    missing = [k for k in ("path", "variant", "seed") if k not in header]
    if missing:
        raise TargetError(f"{source}:1:1: (header): it lacks {', '.join(missing)}, so the "
                          "trial cannot be run again; minimize a trace that `gpurace run "
                          "--record` or `gpurace replay --record` wrote")
    first = _header_line(source)

    def at(key: str) -> str:
        return f"{source}:1:{column_of(first, key)}: {key}"

    path = Path(header["path"])
    scenario = _scenario_at(path, path.suffix == ".jsonl", header.get("defects", {}), at("path"))
    variant = _variant(scenario, header["variant"], at("variant"))
    amplified = header.get("amplify") is not None if amplify is None else amplify
    delay = header.get("delay_us")
    if amplified and delay is None and scenario.amplify is not None:
        delay = scenario.amplify.delay_us
    how = HowRun(amplified, delay, int(header["seed"]), bool(header.get("poison", False)))
    # The trial again on sim says whether it manifests; the trace itself may hold a race the
    # detector finds even when the run did not manifest it.
    try:
        failure = _observe(scenario, variant, how)
    except TargetError:
        findings = [f.to_json() for f in check_trace(trace.records).findings]
        if not findings:
            raise TargetError(f"{source}: the trial neither fails again on the simulated device "
                              "nor holds a race the detector finds; nothing to minimize") from None
        failure = Failure(None, _race_key(findings[0]))
    return _Origin(scenario, variant, how, failure)


def _from_ticket(source: Path, defects: tuple[str, ...], amplify: bool | None) -> _Origin:
    load_ticket(source)  # a bad ticket is said as such, at its line, before anything else
    if not defects:
        raise TargetError(f"{source}: a ticket alone does not fail; name the defect that "
                          "makes it fail with --defect (e.g. publish_on_legacy_stream)")
    scenario = replay_scenario(source, defects)
    variant = scenario.variants[0]
    how = HowRun(True if amplify is None else amplify,
                  scenario.amplify.delay_us if scenario.amplify else None, 0)
    return _Origin(scenario, variant, how, _observe(scenario, variant, how))


def _header_line(source: Path) -> str:
    """The first line of an op trace that load_trace read already (for an error's column)."""
    try:
        head = read_input(source, HEAD_BYTES, "an op trace", head=True)
    except Unreadable:
        return ""
    return head.split(b"\n", 1)[0].decode("utf-8", errors="replace")


def _scenario_at(path: Path, replayed: bool, defects: dict[str, Any], where: str) -> Scenario:
    """The scenario a recorded trial ran: ``path`` is its scenario file, or for a replay the
    ticket (with the defects that were on). ``where`` is ``file:line:col: field`` of the path
    in the trace or the report, for the error when it is no file. The scenario must run to its
    end: minimize has no watchdog, so a step that never ends (``us: .inf``) is refused."""
    if not is_file(path):
        raise TargetError(f"{where}: it was recorded from {show_path(path)}, which is not a "
                          "file here; run minimize in the folder it was recorded in, or copy "
                          "the scenario there")
    if not replayed:
        scenario = load_scenario(path)
        endless = scenario.endless_step()
        if endless is not None:
            raise TargetError(f"{endless.origin}: {endless.label}: this step never ends (us: "
                              ".inf), and minimize runs its trials here, with no watchdog; "
                              "minimize a failure that ends (a crash, a corruption, a race)")
        return scenario
    known = {n: on for n, on in defects.items() if n in kvcore.Defects.names()}
    return replay_scenario(path, kvcore.Defects(**known).active())


def _variant(scenario: Scenario, name: object, where: str) -> Variant:
    """The variant ``name`` of ``scenario``, or a TargetError at ``where``."""
    if isinstance(name, str):
        try:
            return scenario.variant(name)
        except KeyError:
            pass
    raise TargetError(f"{where}: {scenario.path} has no variant {echo(name)} (it has "
                      f"{', '.join(v.name for v in scenario.variants)}); the file changed since "
                      "the trial ran: minimize against the file it ran")


def _failure(report: dict[str, Any], file: Path) -> Failure:
    try:
        outcome = Outcome(report["outcome"])
    except (ValueError, TypeError):
        raise TargetError(f"{file}: outcome: {echo(report['outcome'])} is no outcome gpurace "
                          f"writes ({', '.join(o.value for o in Outcome)}); the report is "
                          "damaged: run the trial again for a new one") from None
    if outcome is not Outcome.CLEAN:
        return Failure(outcome, None)
    findings = report.get("findings") or []
    if not findings:
        raise TargetError(f"{file}: this incident neither manifested nor found a race: nothing "
                          "to keep")
    try:
        return Failure(None, tuple(str(x) for x in _race_key(findings[0])))  # type: ignore
    except (KeyError, TypeError, IndexError):
        raise TargetError(f"{file}: findings[0]: not a finding gpurace writes (buffer, first "
                          "and second with stream and kind); the report is damaged: run the "
                          "trial again for a new one") from None


def _observe(scenario: Scenario, variant: Variant, how: HowRun) -> Failure:
    outcome, findings = sim_trial(scenario, variant, how)
    if outcome is not Outcome.CLEAN:
        return Failure(outcome, None)
    if findings:
        return Failure(None, _race_key(findings[0]))
    raise TargetError(f"{scenario.path}: with {', '.join(variant.defects.active()) or 'no defect'} "
                      "it neither fails nor races on the simulated device; nothing to minimize")


def _step_amplify(amp: Amplify | None, raw: Sequence[dict[str, Any]]) -> Amplify | None:
    """The amplification moved onto a kept step: before the first activation for a replay's
    (which named a phase), or the same step if it is still there."""
    if amp is None:
        return None
    ids = [s.get("id") for s in raw]
    if amp.before in ids:
        return amp
    activations = [s["id"] for s in raw if s["op"] == "activate" and s.get("id")]
    return dataclasses.replace(amp, before=activations[0], sweep=()) if activations else None


def _shrink_counts(raw: list[dict[str, Any]],
                   fails: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """Halve page counts while the failure holds: a race on one page is easier to read."""
    raw = [dict(s) for s in raw]
    for step in raw:
        while "pages" in step and step["pages"] > 1:
            before = step["pages"]
            step["pages"] = max(1, before // 2)
            if not fails(raw):
                step["pages"] = before
                break
    return raw


def _yaml(scenario: Scenario, variant: Variant, source: Path, failure: Failure,
          own_variants: bool) -> str:
    pool = scenario.pool
    spec: dict[str, Any] = {
        "pool": {"pages": pool.pages, "page_tokens": pool.page_tokens,
                 "planes": [{"dtype": p.dtype, "leading": p.leading, "heads": p.heads,
                             "align": p.align} for p in pool.planes],
                 "table_rows": pool.table_rows,
                 **({"max_pages_per_row": pool.max_pages_per_row}
                    if pool.max_pages_per_row else {})},
    }
    if scenario.declared_streams:
        spec["streams"] = {s.name: s.kind if not s.priority else
                           {"kind": s.kind, "priority": s.priority} for s in scenario.streams}
    spec["trials"] = 20
    spec["timeout"] = scenario.timeout_s
    spec["variants"] = {v.name: _variant_yaml(v) for v in scenario.variants} if own_variants \
        else {"buggy": _variant_yaml(dataclasses.replace(variant, expect="reproduces",
                                                         min_rate=0.0)),
              "fixed": {"expect": "clean"}}
    amp = scenario.amplify
    if amp is not None:
        spec["amplify"] = {"delay_us": amp.delay_us, **({"stream": amp.stream}
                                                         if amp.stream else {}),
                           "before": amp.before}
    spec["steps"] = _raw(scenario.steps)
    # Within the loader's limits whatever the source's name and path (the file must load).
    name = f"{scenario.name[:NAME_MAX_CHARS - len('-min')].rstrip('-_')}-min"
    description = clip(plain(f"minimized from {source}: it {failure.describe()}"),
                       TEXT_MAX_CHARS - 1)
    doc = {"apiVersion": "gpurace/v1", "kind": "Scenario",
           "metadata": {"name": name, "description": description,
                        "dangerous": scenario.dangerous or failure.outcome is Outcome.CRASH},
           "spec": spec}
    # plain: a newline in a path or a trace's buffer name would end the comment.
    head = (f"# Minimized by `gpurace minimize {plain(str(source))}`.\n"
            f"# It {plain(failure.describe())} on the simulated device; `gpurace run` it to "
            "check.\n")
    # Steps one per line, as a person writes them: flow style below the top level.
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
    return head + text


def _loads(text: str) -> bool:
    """Whether the strict loader accepts a scenario text."""
    with tempfile.TemporaryDirectory(prefix="gpurace-min-") as tmp:
        path = Path(tmp) / "candidate.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            load_scenario(path)
        except ScenarioError:
            return False
    return True


def _variant_yaml(variant: Variant) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if variant.defects.active():
        out["defects"] = {n: getattr(variant.defects, n) for n in variant.defects.active()}
    out["expect"] = variant.expect
    if variant.min_rate:
        out["min_rate"] = variant.min_rate
    if variant.streams:
        out["streams"] = dict(variant.streams)
    return out


def write_minimized(result: Minimized, output: Path) -> None:
    write_atomic(output, result.scenario_text)

