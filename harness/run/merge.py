"""Shards back into one run: the run documents of ``gpurace run --shard K/N``, K = 1..N, made
into the document one run of all the trials would have written.

Each shard runs the trials whose place in the whole run is K-1 modulo N, with the seeds the
whole run would give them, so the parts add up exactly: counts, rates and their intervals,
folded findings and Xids, and the order-free digest of every trial. What cannot add up is
refused: a shard missing or given twice, an interrupted one, or shards whose plans differ (the
gpurace version, the seed, the backend, an option, a scenario file's contents).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.faults.writes import WriteFault
from harness.errors import MergeError
from harness.inputs import Unreadable, read_input, show_path
from harness.limits import RUN_MAX_BYTES
from harness.results.outcome import VariantResult
from harness.results.run import RUN_SCHEMA, RunResult

_VARIANT_KEYS = ("scenario", "variant", "delay_us", "sweep")
"""What names one entry of a run's results: the same in every shard, in the same order."""

_RUN_KEYS = ("run_id", "folder", "backend", "device", "seed", "poison", "wall_s", "exit_code",
             "stopped", "health", "watch_notes", "plan", "lanes", "retired", "results")
_RESULT_KEYS = ("expect", "path", "dangerous", "amplified", "status", "reason", "trials",
                "wall_s", "min_rate", "reports", "outcomes", "detected", "reproduced",
                "not_clean", "reissued", "first_manifested", "traces", "crash_requests",
                "restart_s", "findings", "xids", "digest", *_VARIANT_KEYS)


def read_run(path: Path) -> dict[str, Any]:
    """A run document from ``path``, checked to be a shard's ``gpurace.run/1``."""
    where = show_path(path)
    try:
        doc = json.loads(read_input(path, RUN_MAX_BYTES, "a run document"))
    except Unreadable as exc:
        raise MergeError(f"{where}: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MergeError(f"{where}: not JSON ({exc}); pass the run.json a run wrote") from None
    if not isinstance(doc, dict) or doc.get("schema") != RUN_SCHEMA:
        raise MergeError(f"{where}: not a {RUN_SCHEMA} document; pass the run.json a run wrote")
    if doc.get("shards"):
        raise MergeError(f"{where}: already a merged run; merge the shards' own documents")
    shard = doc.get("shard")
    if not isinstance(shard, dict):
        raise MergeError(f"{where}: this run was not a shard (it ran without --shard K/N), so "
                         "it has nothing to merge with")
    lacking = [k for k in _RUN_KEYS if k not in doc] or sorted({
        k for r in doc["results"] if isinstance(r, dict) for k in _RESULT_KEYS if k not in r}
        if isinstance(doc["results"], list) else ["a list of results"])
    if lacking or not isinstance(shard.get("index"), int) or not isinstance(
            shard.get("count"), int):
        what = ", ".join(lacking) or "a shard number"
        raise MergeError(f"{where}: a {RUN_SCHEMA} document without {what}; pass the run.json "
                         "a run wrote, unedited")
    if doc.get("interrupted"):
        raise MergeError(f"{where}: shard {shard['index']}/{shard['count']} was interrupted "
                         f"({doc['interrupted']}) and holds only part of its trials; run that "
                         "shard again")
    return doc


def merge_runs(paths: Sequence[Path], folder: Path) -> RunResult:
    """One run from the shard documents at ``paths`` (all N of one campaign, any order); its
    ``folder`` is where the merged run.json goes. Raises :class:`MergeError`."""
    try:
        return _merge(paths, folder)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # Past read_run's checks, only a document edited by hand gets here.
        raise MergeError(f"a shard document holds a value of the wrong kind ({type(exc).__name__}"
                         f": {exc}); pass the run.json files the runs wrote, unedited") from None


def _merge(paths: Sequence[Path], folder: Path) -> RunResult:
    docs = sorted(((read_run(p), p) for p in paths), key=lambda d: d[0]["shard"]["index"])
    first, first_path = docs[0]
    count = first["shard"]["count"]
    seen: dict[int, Path] = {}
    for doc, path in docs:
        k, n = doc["shard"]["index"], doc["shard"]["count"]
        if n != count:
            raise MergeError(f"{show_path(path)} is shard {k}/{n}, {show_path(first_path)} "
                             f"one of {count}: merge the shards of one campaign")
        if k in seen:
            raise MergeError(f"shard {k}/{n} is given twice: {show_path(seen[k])} and "
                             f"{show_path(path)}")
        seen[k] = path
        _same_plan(first, first_path, doc, path)
    missing = [str(k) for k in range(1, count + 1) if k not in seen]
    if missing:
        raise MergeError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of "
                         f"{count} missing: merge all {count} documents")
    results = [VariantResult.from_json(r) for r in first["results"]]
    for doc, path in docs[1:]:
        keys = [tuple(r[k] for k in _VARIANT_KEYS) for r in doc["results"]]
        if keys != [tuple(r[k] for k in _VARIANT_KEYS) for r in first["results"]]:
            raise MergeError(f"{show_path(path)} ran other variants than "
                             f"{show_path(first_path)}: merge the shards of one campaign")
        for merged, part in zip(results, doc["results"]):
            merged.absorb(VariantResult.from_json(part))
    stopped = "; ".join(f"shard {d['shard']['index']}: {d['stopped']}"
                        for d, _ in docs if d.get("stopped"))
    return RunResult(
        backend=first["backend"], device=first["device"], seed=first["seed"],
        results=results, wall_s=max(d["wall_s"] for d, _ in docs),
        health={"before": None, "after": None},  # each shard's is in shards
        stopped=stopped, watch_notes=sorted({n for d, _ in docs for n in d["watch_notes"]}),
        folder=str(folder), run_id=f"merged-{first['plan']['digest'][:12]}",
        poison=first["poison"], plan=first["plan"],
        lanes=[f"shard {d['shard']['index']}: {lane}" for d, _ in docs for lane in d["lanes"]],
        retired=[f"shard {d['shard']['index']}: {r}" for d, _ in docs for r in d["retired"]],
        # What a shard could not write is lost from the merged run too: it exits 4 as well.
        write_errors=[WriteFault.from_json(f) for d, _ in docs
                      for f in d.get("write_errors", [])],
        watch_gaps=[f"shard {d['shard']['index']}: {g}" for d, _ in docs
                    for g in d.get("watch_gaps", [])],
        shards=[{"index": d["shard"]["index"], "count": count, "path": str(p),
                 "run_id": d["run_id"], "folder": d["folder"], "device": d["device"],
                 "health": d["health"], "wall_s": d["wall_s"], "exit_code": d["exit_code"]}
                for d, p in docs])


def _same_plan(a: dict[str, Any], a_path: Path, b: dict[str, Any], b_path: Path) -> None:
    """Refuse shards that did not run the same plan, saying what differs."""
    pa, pb = a["plan"], b["plan"]
    if pa["digest"] == pb["digest"]:
        return
    names = f"{show_path(a_path)} and {show_path(b_path)}"
    for key, what in (("version", "gpurace versions"), ("seed", "seeds"),
                      ("backend", "backends")):
        if pa.get(key) != pb.get(key):
            raise MergeError(f"{names} differ in their {what} ({pa.get(key)}, {pb.get(key)}): "
                             "the shards of one campaign run the same gpurace, seed and backend")
    differ = sorted(name for name in set(pa["sources"]) | set(pb["sources"])
                    if pa["sources"].get(name) != pb["sources"].get(name))
    if differ:
        raise MergeError(f"{names} ran different contents of scenario {', '.join(differ)}: "
                         "run every shard from the same scenario files")
    raise MergeError(f"{names} ran with different options (trials, variants, amplification, "
                     "delay, timeout, detection, poison or schedule): run every shard with the "
                     "same command but for --shard")
