"""Benchmark: the harness's in-process trial rate against a bare CuPy loop doing the same work.

    python -m harness.bench [--trials 2000] [--variant fixed] [--delays 0,1000]
    python -m harness.bench --gpus 2 --trials 300 [--scenario catalog-reactivation]

One trial of cross_stream_race, run by the harness's TrialExecutor (the pool, its bookkeeping,
the op-log hooks, the checks) and by a bare loop of CuPy calls issuing the same operations: fill
the old host page, the delay on the transfer stream, the old page's copy there, the fresh host
page and its copy on the compute stream, a device sync, the read-back on the compute stream, a
stream sync and the compare. Both run side by side in this one process, alternating in blocks,
and the figure is the ratio of their times (absolute times on a shared machine drift).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import kvcore
from harness.detector import RaceDetector
from harness.executor import TrialExecutor
from harness.runner import choose_backend
from harness.targets import SCENARIO_ROOT
from harness.scenario import load_scenario

_SPIN = r"""
extern "C" __global__ void spin(long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


def _bare_trial(page_bytes: int, delay_us: float) -> Callable[[], bool]:
    """The same trial as bare CuPy calls; returns a function running one trial (True when the
    read-back holds the fresh bytes)."""
    import cupy as cp

    rt = cp.cuda.runtime
    spin = cp.RawKernel(_SPIN, "spin")
    compute, transfer = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
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
        fresh[:] = 0xCD
        rt.memcpyAsync(page.ptr, base + page_bytes, page_bytes, 4, compute.ptr)
        rt.deviceSynchronize()
        rt.memcpyAsync(base + 2 * page_bytes, page.ptr, page_bytes, 4, compute.ptr)
        compute.synchronize()
        return bool((back == fresh).all())

    return trial


def measure(trials: int, variant: str, delay_us: float, block: int = 100) -> dict[str, float]:
    backend = choose_backend("cuda")
    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    executor = TrialExecutor(scenario, scenario.variant(variant), backend, amplify=delay_us > 0,
                             delay_us=delay_us or None)
    bare = _bare_trial(scenario.pool.geometry().page_stride, delay_us)
    harness_s: list[float] = []
    bare_s: list[float] = []
    manifested = {"harness": 0, "bare": 0}
    index = 0
    for _ in range(max(1, trials // block)):
        t0 = time.perf_counter()
        for _ in range(block):
            manifested["harness"] += executor.run(index, index).outcome.manifested
            index += 1
        t1 = time.perf_counter()
        for _ in range(block):
            manifested["bare"] += not bare()
        t2 = time.perf_counter()
        harness_s.append((t1 - t0) / block)
        bare_s.append((t2 - t1) / block)
    h, b = statistics.median(harness_s), statistics.median(bare_s)
    return {"delay_us": delay_us, "harness_us": h * 1e6, "bare_us": b * 1e6, "ratio": h / b,
            "harness_manifested": manifested["harness"], "bare_manifested": manifested["bare"],
            "trials": index}


def measure_detector(backend: str, trials: int, variant: str, delay_us: float,
                     block: int = 100) -> dict[str, float]:
    """The race detector's cost: trials with it listening against trials without, the same
    executor code, alternating in blocks in one process."""
    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    detector = RaceDetector()
    plain = TrialExecutor(scenario, scenario.variant(variant), backend, amplify=delay_us > 0,
                          delay_us=delay_us or None)
    watched = TrialExecutor(scenario, scenario.variant(variant), backend,
                            amplify=delay_us > 0, delay_us=delay_us or None,
                            on_device=detector.attach)
    on_s: list[float] = []
    off_s: list[float] = []
    found = 0
    index = 0
    for _ in range(max(1, trials // block)):
        t0 = time.perf_counter()
        for _ in range(block):
            detector.reset()
            watched.run(index, index)
            found += bool(detector.findings)
            index += 1
        t1 = time.perf_counter()
        for _ in range(block):
            plain.run(index, index)
        t2 = time.perf_counter()
        on_s.append((t1 - t0) / block)
        off_s.append((t2 - t1) / block)
    on, off = statistics.median(on_s), statistics.median(off_s)
    return {"delay_us": delay_us, "on_us": on * 1e6, "off_us": off * 1e6, "ratio": on / off,
            "found": found, "trials": index}


def measure_lanes(backend: str, target: str, variant: str, trials: int, gpus: str,
                  rounds: int = 2, spares: int | None = None) -> dict[str, dict[str, float]]:
    """The same runs (``trials`` of one variant, dangerous ones too) on one lane and on
    ``gpus`` lanes, alternating, ``rounds`` times each: trials a second (median of the rounds)
    and, where workers died, the restart times (worker death to the next hand-over)."""
    import tempfile
    from pathlib import Path

    from harness.runner import RunOptions, Runner
    from harness.targets import resolve_targets

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
    try:
        got = measure_lanes(args.backend, args.scenario, args.variant, args.trials, args.gpus,
                            args.rounds, args.spares)
    except (kvcore.KVCoreError, Exception) as exc:  # noqa: BLE001 - a benchmark reports any
        print(f"harness.bench: {exc}", file=sys.stderr)
        return 77 if "cuda" in str(exc).lower() else 1
    print(f"{args.scenario} [{args.variant}] on {args.backend}, {args.trials} trials a run, "
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
    parser.add_argument("--variant", default="fixed", choices=["fixed", "buggy"])
    parser.add_argument("--delays", default="0,1000",
                        help="comma-separated amplifying delays in us (0: none)")
    parser.add_argument("--detector", action="store_true",
                        help="measure the race detector's cost instead: trials with it on "
                             "against trials with it off")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "sim"],
                        help="backend for --detector and --gpus (the bare loop needs cuda)")
    parser.add_argument("--gpus",
                        help="measure runs on these GPUs (all, N, or 0,2) against runs on one "
                             "instead: the trial rate ratio, and the restart times of dying "
                             "workers")
    parser.add_argument("--scenario", default="catalog-reactivation",
                        help="the scenario for --gpus (with --variant buggy, "
                             "catalog-reactivation is a crash soak)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="for --gpus: runs of each kind, alternating (the median counts)")
    parser.add_argument("--spares", type=int,
                        help="for --gpus: spare workers (default: the run's, 0 on a GPU)")
    args = parser.parse_args(argv)
    if args.detector:
        return _detector_main(args)
    if args.gpus:
        return _lanes_main(args)
    try:
        rows = [measure(args.trials, args.variant, float(d)) for d in args.delays.split(",")]
    except (kvcore.KVCoreError, Exception) as exc:  # noqa: BLE001 - a benchmark reports any
        print(f"harness.bench: {exc}", file=sys.stderr)
        return 77 if "cuda" in str(exc).lower() else 1
    print(f"cross_stream_race [{args.variant}] per trial, median of blocks of 100, "
          f"harness (TrialExecutor) vs bare CuPy loop, same process:")
    for r in rows:
        print(f"  delay {r['delay_us']:6.0f} us: harness {r['harness_us']:8.1f} us, bare "
              f"{r['bare_us']:8.1f} us, ratio {r['ratio']:.3f}  (manifested: harness "
              f"{r['harness_manifested']}/{r['trials']}, bare {r['bare_manifested']}/"
              f"{r['trials']})")
    return 0


def _detector_main(args: argparse.Namespace) -> int:
    try:
        rows = [measure_detector(args.backend, args.trials, args.variant, float(d))
                for d in args.delays.split(",")]
    except kvcore.KVCoreError as exc:
        print(f"harness.bench: {exc}", file=sys.stderr)
        return 77 if isinstance(exc, kvcore.DeviceUnavailableError) else 1
    print(f"cross_stream_race [{args.variant}] on {args.backend}, per trial, median of blocks "
          "of 100, race detector on vs off, same process:")
    for r in rows:
        print(f"  delay {r['delay_us']:6.0f} us: detector on {r['on_us']:8.1f} us, off "
              f"{r['off_us']:8.1f} us, ratio {r['ratio']:.3f}  (trials with findings: "
              f"{r['found']}/{r['trials']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
