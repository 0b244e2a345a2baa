"""Benchmark: the harness's in-process trial rate against a bare CuPy loop doing the same work.

    python -m harness.bench [--trials 2000] [--variant buggy|fixed|both] [--delays 0,1000]
    python -m harness.bench --detector [--backend cuda|sim]
    python -m harness.bench --timeline
    python -m harness.bench --profile [--backend cuda|sim] [--trials 2000]
    python -m harness.bench --split [--backend cuda|sim] [--scenario NAME]
    python -m harness.bench --gpus 2 --trials 300 [--scenario catalog-reactivation]

One trial of cross_stream_race, run by the harness's TrialExecutor (the pool, its bookkeeping,
the checks) and by a bare loop of CuPy calls issuing the same operations as that variant: fill
the old host page, the delay on the transfer stream, the old page's copy there, (fixed: the
release fence's event recorded on the transfer stream), the fresh host page, (fixed: the compute
stream's wait on that event) and the fresh page's copy on the compute stream, a device sync, the
read-back, a stream sync and the compare. Both run side by side in this one process, alternating
in blocks, and the figure is the ratio of their times (absolute times on a shared machine
drift). The executor reissues the device program its first clean trial captured, as a run's
workers do; a second column runs the same executor step by step (``--no-reissue``), a third is
a run's worker (TrialRunner: the executor, the flight recorder writing the trial's trace, the
race detector), a fourth the worker step by step (what it does for every scenario it cannot
reissue: host threads, tables, catalogs), each against the same bare loop.

``--timeline`` measures what timing every stream op with CUDA events costs a run's worker:
trials with ``--timeline`` against trials without, alternating.

``--profile`` says where a trial's host time goes, by part (the executor, the device layer, the
flight recorder, the detector, the worker's record, CuPy): a run's worker, and the executor step
by step (:mod:`harness.speed.profile`).

``--split`` takes a run's worker apart: the same trials with the op log, the flight recorder
and the detector switched on one at a time (:mod:`harness.speed.split`), reissued and step by
step, measured rather than profiled.

``--detector`` measures the race detector's cost: trials with it on against trials with it off,
in the executor alone (on: the detector is the op log's only reader, so a reissued trial hands it
its records as one segment, unbuilt; off: no op log at all) and in a run's worker (the flight
recorder builds every record either way; off is ``--no-detect``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import kvcore
from harness.races.detector import RaceDetector
from harness.run.executor import TrialExecutor
from harness.run.runner import choose_backend
from harness.lang.targets import SCENARIO_ROOT
from harness.lang.scenario import load_scenario
from harness.speed.blocks import alternate
from harness.speed.inprocess import worker_here

_SPIN = r"""
extern "C" __global__ void spin(long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


def _bare_trial(page_bytes: int, delay_us: float, fence: bool) -> Callable[[], bool]:
    """The same trial as bare CuPy calls; returns a function running one trial (True when the
    read-back holds the fresh bytes). ``fence``: the fixed variant's event record and wait."""
    import cupy as cp

    rt = cp.cuda.runtime
    spin = cp.RawKernel(_SPIN, "spin")
    compute, transfer = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    released = cp.cuda.Event(disable_timing=True)
    page = cp.cuda.Memory(page_bytes)
    pinned = cp.cuda.alloc_pinned_memory(3 * page_bytes)
    host = np.frombuffer(pinned, np.uint8, 3 * page_bytes)
    old, fresh, back = (host[i * page_bytes:(i + 1) * page_bytes] for i in range(3))
    base = host.ctypes.data
    ns = np.int64(int(delay_us * 1000))

    def trial() -> bool:
        old[:] = 0xAB
        if delay_us:
            spin((1,), (1,), (ns,), stream=transfer)
        rt.memcpyAsync(page.ptr, base, page_bytes, 4, transfer.ptr)
        if fence:
            rt.eventRecord(released.ptr, transfer.ptr)
        fresh[:] = 0xCD
        if fence:
            rt.streamWaitEvent(compute.ptr, released.ptr, 0)
        rt.memcpyAsync(page.ptr, base + page_bytes, page_bytes, 4, compute.ptr)
        rt.deviceSynchronize()
        rt.memcpyAsync(base + 2 * page_bytes, page.ptr, page_bytes, 4, compute.ptr)
        compute.synchronize()
        return bool((back == fresh).all())

    return trial


def measure(trials: int, variant: str, delay_us: float, block: int = 100) -> dict[str, float]:
    backend = choose_backend("cuda")
    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    chosen = scenario.variant(variant)
    executor, stepped = (TrialExecutor(scenario, chosen, backend, amplify=delay_us > 0,
                                       delay_us=delay_us or None, reissue=reissue)
                         for reissue in (True, False))
    bare = _bare_trial(scenario.pool.geometry().page_stride, delay_us,
                       fence=chosen.defects.release_fence)
    with tempfile.TemporaryDirectory(prefix="gpurace-bench-") as tmp:
        worker = worker_here(scenario, variant, backend, delay_us, True, Path(tmp) / "reissued")
        # What a run's worker does for scenarios it cannot reissue (host threads among them).
        worker_stepped = worker_here(scenario, variant, backend, delay_us, True,
                                     Path(tmp) / "stepped", reissue=False)
        (h, st, w, ws, b), manifested = alternate([
            lambda i: executor.run(i, i).outcome.manifested,
            lambda i: stepped.run(i, i).outcome.manifested,
            lambda i: worker.run(i, i).outcome != "clean",
            lambda i: worker_stepped.run(i, i).outcome != "clean",
            lambda i: not bare()], trials, block)
    return {"variant": variant, "delay_us": delay_us, "harness_us": h * 1e6,
            "stepped_us": st * 1e6, "worker_us": w * 1e6, "worker_stepped_us": ws * 1e6,
            "bare_us": b * 1e6, "ratio": h / b, "stepped_ratio": st / b, "worker_ratio": w / b,
            "worker_stepped_ratio": ws / b, "reissued": executor.reissued,
            **{f"{k}_manifested": v for k, v in zip(
                ("harness", "stepped", "worker", "worker_stepped", "bare"), manifested)},
            "trials": max(1, trials // block) * block}


def measure_detector(backend: str, trials: int, variant: str, delay_us: float,
                     block: int = 100) -> dict[str, Any]:
    """The race detector's cost: trials with it on against trials with it off, alternating in
    blocks in one process, in the executor alone and in a run's worker."""
    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    detector = RaceDetector()
    chosen = scenario.variant(variant)
    plain = TrialExecutor(scenario, chosen, backend, amplify=delay_us > 0,
                          delay_us=delay_us or None)
    watched = TrialExecutor(scenario, chosen, backend, amplify=delay_us > 0,
                            delay_us=delay_us or None, on_device=detector.attach)

    def executor_on(index: int) -> bool:
        detector.reset()
        watched.run(index, index)
        return bool(detector.findings)

    out: dict[str, Any] = {"variant": variant, "delay_us": delay_us}
    with tempfile.TemporaryDirectory(prefix="gpurace-bench-") as tmp:
        on_worker = worker_here(scenario, variant, backend, delay_us, True, Path(tmp) / "on")
        off_worker = worker_here(scenario, variant, backend, delay_us, False, Path(tmp) / "off")
        pairs = {
            "executor": (executor_on, lambda i: bool(plain.run(i, i).outcome.manifested)),
            "worker": (lambda i: bool(on_worker.run(i, i).findings),
                       lambda i: bool(off_worker.run(i, i).findings)),
        }
        for name, (on, off) in pairs.items():
            (on_s, off_s), (found, _) = alternate([on, off], trials, block)
            out[name] = {"on_us": on_s * 1e6, "off_us": off_s * 1e6, "ratio": on_s / off_s,
                         "found": found}
    out["trials"] = max(1, trials // block) * block
    return out


def measure_timeline(trials: int, variant: str, delay_us: float,
                     block: int = 100) -> dict[str, Any]:
    """A run's worker with ``--timeline`` against one without, alternating in blocks."""
    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    with tempfile.TemporaryDirectory(prefix="gpurace-bench-") as tmp:
        timed = worker_here(scenario, variant, "cuda", delay_us, True, Path(tmp) / "on",
                            timeline=True)
        plain = worker_here(scenario, variant, "cuda", delay_us, True, Path(tmp) / "off")
        (on_s, off_s), (found, _) = alternate(
            [lambda i: timed.run(i, i).outcome != "clean",
             lambda i: plain.run(i, i).outcome != "clean"], trials, block)
    return {"variant": variant, "delay_us": delay_us, "on_us": on_s * 1e6,
            "off_us": off_s * 1e6, "ratio": on_s / off_s, "manifested": found,
            "trials": max(1, trials // block) * block}


def measure_lanes(backend: str, target: str, variant: str, trials: int, gpus: str,
                  rounds: int = 2, spares: int | None = None) -> dict[str, dict[str, float]]:
    """The same runs (``trials`` of one variant, dangerous ones too) on one lane and on
    ``gpus`` lanes, alternating, ``rounds`` times each: trials a second (median of the rounds)
    and, where workers died, the restart times (worker death to the next hand-over)."""
    from harness.run.options import RunOptions
    from harness.run.runner import Runner
    from harness.lang.targets import resolve_targets

    scenarios = resolve_targets([target], ())
    walls: dict[str, list[float]] = {"one": [], "many": []}
    restarts: dict[str, list[float]] = {"one": [], "many": []}
    with tempfile.TemporaryDirectory(prefix="gpurace-bench-") as tmp:
        for _ in range(rounds):
            for key, lanes in (("one", None), ("many", gpus)):
                options = RunOptions(backend=backend, trials=trials, variants=(variant,),
                                     dangerous=True, gpus=lanes, max_incidents=1,
                                     spares=spares, out_dir=Path(tmp) / key)
                start = time.perf_counter()
                [result] = Runner(options).run(scenarios).results
                walls[key].append(time.perf_counter() - start)
                restarts[key] += result.restart_s
    out = {}
    for key in walls:
        rs = sorted(restarts[key])
        out[key] = {"rate": trials / statistics.median(walls[key]), "restarts": len(rs),
                    "median_s": statistics.median(rs) if rs else 0.0,
                    "p95_s": rs[min(len(rs) - 1, round(0.95 * (len(rs) - 1)))] if rs else 0.0}
    return out


def _lanes_main(args: argparse.Namespace) -> int:
    variant = "fixed" if args.variant == "both" else args.variant
    args.scenario = args.scenario or "catalog-reactivation"
    try:
        got = measure_lanes(args.backend, args.scenario, variant, args.trials, args.gpus,
                            args.rounds, args.spares)
    except (kvcore.KVCoreError, Exception) as exc:  # noqa: BLE001 - a benchmark reports any
        print(f"harness.bench: {exc}", file=sys.stderr)
        return 77 if "cuda" in str(exc).lower() else 1
    print(f"{args.scenario} [{variant}] on {args.backend}, {args.trials} trials a run, "
          f"one GPU against --gpus {args.gpus}, alternating in one process:")
    for key, label in (("one", "1 lane"), ("many", f"--gpus {args.gpus}")):
        r = got[key]
        print(f"  {label:>12}: {r['rate']:8.1f} trials/s; restarts {r['restarts']}, median "
              f"{r['median_s'] * 1e3:.1f} ms, p95 {r['p95_s'] * 1e3:.1f} ms")
    print(f"  trial rate ratio: {got['many']['rate'] / got['one']['rate']:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--variant", default="both", choices=["buggy", "fixed", "both"],
                        help="the variant(s) of cross_stream_race (for --gpus: buggy or fixed)")
    parser.add_argument("--delays", default="0,1000",
                        help="comma-separated amplifying delays in us (0: none)")
    parser.add_argument("--detector", action="store_true",
                        help="measure the race detector's cost instead: trials with it on "
                             "against trials with it off")
    parser.add_argument("--timeline", action="store_true",
                        help="measure --timeline's cost instead: a run's worker timing every "
                             "stream op with CUDA events against one that does not")
    parser.add_argument("--profile", action="store_true",
                        help="say where a trial's host time goes instead, by part: a run's "
                             "worker, and the executor step by step")
    parser.add_argument("--split", action="store_true",
                        help="take a run's worker apart instead: the same trials with the op "
                             "log, the flight recorder and the detector switched on one at a "
                             "time, reissued and step by step")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "sim"],
                        help="backend for --detector, --profile, --split and --gpus (the bare "
                             "loop needs cuda)")
    parser.add_argument("--gpus",
                        help="measure runs on these GPUs (all, N, or 0,2) against runs on one "
                             "instead: the trial rate ratio, and the restart times of dying "
                             "workers")
    parser.add_argument("--scenario",
                        help="the scenario for --gpus (default catalog-reactivation: with "
                             "--variant buggy, a crash soak), --profile and --split (default "
                             "cross-stream-race)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="for --gpus: runs of each kind, alternating (the median counts)")
    parser.add_argument("--spares", type=int,
                        help="for --gpus: spare workers (default: the run's, 0 on a GPU)")
    args = parser.parse_args(argv)
    if args.detector:
        return _detector_main(args)
    if args.profile:
        return _profile_main(args)
    if args.split:
        return _split_main(args)
    if args.timeline:
        return _timeline_main(args)
    if args.gpus:
        return _lanes_main(args)
    try:
        rows = [measure(args.trials, v, float(d)) for v in _variants(args.variant)
                for d in args.delays.split(",")]
    except (kvcore.KVCoreError, Exception) as exc:  # noqa: BLE001 - a benchmark reports any
        print(f"harness.bench: {exc}", file=sys.stderr)
        return 77 if "cuda" in str(exc).lower() else 1
    print("cross_stream_race per trial, median of blocks of 100, same process: the executor "
          "(TrialExecutor, reissuing its captured program), the executor step by step (no "
          "program), a run's worker (executor, flight recorder, detector), the worker step by "
          "step (as for scenarios it cannot reissue), and a bare CuPy loop doing that "
          "variant's work; ratios against the bare loop:")
    for r in rows:
        n = r["trials"]
        print(f"  {r['variant']:>5}, delay {r['delay_us']:6.0f} us: executor "
              f"{r['harness_us']:7.1f} us ({r['ratio']:.3f}), stepped {r['stepped_us']:7.1f} "
              f"us ({r['stepped_ratio']:.3f}), worker {r['worker_us']:7.1f} us "
              f"({r['worker_ratio']:.3f}), worker stepped {r['worker_stepped_us']:7.1f} us "
              f"({r['worker_stepped_ratio']:.3f}), bare {r['bare_us']:7.1f} us; reissued "
              f"{r['reissued']} trials; manifested: executor {r['harness_manifested']}/{n}, "
              f"stepped {r['stepped_manifested']}/{n}, worker {r['worker_manifested']}/{n}, "
              f"worker stepped {r['worker_stepped_manifested']}/{n}, "
              f"bare {r['bare_manifested']}/{n}")
    return 0


def _variants(choice: str) -> list[str]:
    return ["buggy", "fixed"] if choice == "both" else [choice]


def _timeline_main(args: argparse.Namespace) -> int:
    try:
        rows = [measure_timeline(args.trials, v, float(d)) for v in _variants(args.variant)
                for d in args.delays.split(",")]
    except (kvcore.KVCoreError, Exception) as exc:  # noqa: BLE001 - a benchmark reports any
        print(f"harness.bench: {exc}", file=sys.stderr)
        return 77 if "cuda" in str(exc).lower() else 1
    print("cross_stream_race on cuda, per trial, median of blocks of 100, a run's worker with "
          "--timeline (CUDA events around every stream op) vs without, same process:")
    for r in rows:
        print(f"  {r['variant']:>5}, delay {r['delay_us']:6.0f} us: timeline {r['on_us']:8.1f} "
              f"us, without {r['off_us']:8.1f} us, ratio {r['ratio']:.3f}  (manifested with "
              f"timeline: {r['manifested']}/{r['trials']})")
    return 0


def measure_profile(backend: str, trials: int, variant: str, delay_us: float,
                    target: str = "cross-stream-race") -> dict[str, Any]:
    """Where a trial's host time goes: a run's worker, and the executor step by step."""
    from harness.speed.profile import profile
    from harness.lang.targets import resolve_targets

    [scenario] = resolve_targets([target], ())
    stepped = TrialExecutor(scenario, scenario.variant(variant), backend, amplify=delay_us > 0,
                            delay_us=delay_us or None, reissue=False)
    with tempfile.TemporaryDirectory(prefix="gpurace-bench-") as tmp:
        worker = worker_here(scenario, variant, backend, delay_us, True, Path(tmp))
        for index in range(10):  # past the capture: the trials a run's worker mostly runs
            worker.run(index, index)
        got = {"worker": profile(lambda i: worker.run(i, i), trials, first=10),
               "stepped": profile(lambda i: stepped.run(i, i), trials, first=10),
               "reissued": worker.executor.reissued}
    return {"scenario": scenario.name, "variant": variant, "delay_us": delay_us, **got}


def _each_point(args: argparse.Namespace,
                measure: Callable[[str, float], Any]) -> list[Any] | int:
    """``measure(variant, delay_us)`` for each variant and delay asked for; the exit code
    instead when the device cannot be had or fails."""
    try:
        return [measure(v, float(d)) for v in _variants(args.variant)
                for d in args.delays.split(",")]
    except kvcore.KVCoreError as exc:
        print(f"harness.bench: {exc}", file=sys.stderr)
        return 77 if isinstance(exc, kvcore.DeviceUnavailableError) else 1


def _profile_main(args: argparse.Namespace) -> int:
    rows = _each_point(args, lambda v, d: measure_profile(
        args.backend, args.trials, v, d, args.scenario or "cross-stream-race"))
    if isinstance(rows, int):
        return rows
    print(f"{rows[0]['scenario'] if rows else args.scenario} on {args.backend}: where a "
          "trial's host time goes, by part (shares from cProfile, microseconds from the same "
          "trials unprofiled):")
    for r in rows:
        print(f"  {r['variant']}, delay {r['delay_us']:g} us: a run's worker ({r['reissued']} "
              f"of its trials reissued):")
        print(r["worker"].table())
        print(f"  {r['variant']}, delay {r['delay_us']:g} us: the executor step by step:")
        print(r["stepped"].table())
    return 0


def _split_main(args: argparse.Namespace) -> int:
    from harness.speed.split import split
    from harness.lang.targets import resolve_targets

    [scenario] = resolve_targets([args.scenario or "cross-stream-race"], ())
    rows = _each_point(args, lambda v, d: [split(scenario, v, args.backend, reissue=r,
                                                 trials=args.trials, delay_us=d)
                                           for r in (True, False)])
    if isinstance(rows, int):
        return rows
    print(f"{scenario.name} on {args.backend}, per trial, median of blocks of 100, the world "
          "kept from trial to trial: the executor, then with each part a run's worker "
          "attaches:")
    for pair in rows:
        for got in pair:
            print(f"  {got.heading()}")
            print(got.table())
    return 0


def _detector_main(args: argparse.Namespace) -> int:
    rows = _each_point(args, lambda v, d: measure_detector(args.backend, args.trials, v, d))
    if isinstance(rows, int):
        return rows
    print(f"cross_stream_race on {args.backend}, per trial, median of blocks of 100, race "
          "detector on vs off, same process; in the executor alone (off: no op log at all) and "
          "in a run's worker (its flight recorder builds the op log either way):")
    for r in rows:
        for where in ("executor", "worker"):
            m = r[where]
            print(f"  {r['variant']:>5}, delay {r['delay_us']:6.0f} us, {where:>8}: on "
                  f"{m['on_us']:7.1f} us, off {m['off_us']:7.1f} us, ratio {m['ratio']:.3f}  "
                  f"(trials with findings: {m['found']}/{r['trials']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
