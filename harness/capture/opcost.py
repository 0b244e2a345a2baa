"""What `gpurace watch` costs a PyTorch program per op, part by part, and whether it grows with
tensor size.

    python -m harness.capture.opcost                      (CUDA when there is a GPU, else CPU)
    python -m harness.capture.opcost --device cpu --ops 20000 --sizes 4096 4194304

In one process, for each tensor size, the same loop of ops runs:

- bare;
- under the PyTorch source's dispatch mode with the capture switched off (what PyTorch's Python
  dispatch costs by itself: every op leaves C++ for the mode's ``__torch_dispatch__``);
- with the capture on (the source reads each op's tensors, finds its stream and the program's
  line, and hands its event to the sink): its own time per op, from the source's stats, and
  the whole op's;

and then the events it captured are fed to the watching side (translator and detector), timed
per op. The ops are ``torch.add(a, b, out=c)`` (two reads, one write, no allocation) and
``a + b`` (a new tensor each time: an allocation and, when it dies, a free), the first
again at the end of a 2,000-line function (``add_out_long``), and ``a + b`` of two tensors in
the host's pageable memory (``host_add_new``: the host's private work, which a program's data
preparation and a CPU test suite are made of, and which the capture must pass by cheaply). On
a CPU, the other tensors are taken for pinned memory, so each op is the host's access to
watched memory: the same work per op as a stream op but the stream's lookup. Rounds
alternate off and on; the fastest round of each is kept (the others met other work on the
machine). Nothing here is a test: the figures go to docs/, with the machine they were
measured on.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.capture import events as E
from harness.capture.analysis import RunAnalysis
from harness.capture.parts import split as split_parts

SIZES = (4096, 4 << 20)


def _loop(op: Callable[[], Any], n: int, sync: Callable[[], None]) -> float:
    """Seconds per op of ``n`` calls of ``op``, the device's queue drained before and after."""
    sync()
    start = time.perf_counter()
    for _ in range(n):
        op()
    sync()
    return (time.perf_counter() - start) / n


def measure(device: str, ops: int, sizes: tuple[int, ...], rounds: int, parts: bool = False
            ) -> dict[str, Any]:
    import torch

    from harness.capture import torch_source

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    tensors = {}
    host = {}  # pageable CPU tensors, never taken for pinned ones
    for size in sizes:
        a, b, c = (torch.ones(size // 4, device=device) for _ in range(3))
        tensors[size] = (a, b, c)
        host[size] = (torch.ones(size // 4), torch.ones(size // 4))

    def kinds(size: int) -> dict[str, Callable[[], Any]]:
        a, b, c = tensors[size]
        d, e = host[size]
        return {"add_out": lambda: torch.add(a, b, out=c), "add_new": lambda: a + b,
                "add_out_long": _at_the_end_of_a_long_function(torch, a, b, c),
                "host_add_new": lambda: d + e}

    rows: list[dict[str, Any]] = []
    best: dict[tuple[int, str, str], float] = {}

    def keep(key: tuple[int, str, str], value: float) -> None:
        best[key] = min(best.get(key, value), value)

    for size in sizes:
        for name, op in kinds(size).items():
            op()  # the kernel loaded, the allocator warm
            for _ in range(rounds):
                keep((size, name, "bare"), _loop(op, ops, sync))
    if device == "cuda":
        # PyTorch's GPU trace alone, which the capture switches on (and nothing switches
        # off): every allocation, free, event and synchronize then calls into Python.
        # PyTorch calls the hooks through the module: imported first, or each call fails.
        import torch.cuda._gpu_trace  # noqa: F401
        torch._C._activate_gpu_trace()
        for size in sizes:
            for name, op in kinds(size).items():
                for _ in range(rounds):
                    keep((size, name, "trace"), _loop(op, ops, sync))
    out = io.StringIO()
    sink = E.Sink(out)

    def install() -> Any:
        stop = torch_source.install(sink)
        if device == "cpu":
            for a, b, c in tensors.values():
                for t in (a, b, c):
                    stop.capture.pinned[t.untyped_storage().data_ptr()] = {}
        return stop

    stop = install()
    cap = stop.capture
    own: dict[tuple[int, str], float] = {}
    for size in sizes:
        for name, op in kinds(size).items():
            for _ in range(rounds):
                cap.on = False
                keep((size, name, "mode"), _loop(op, ops, sync))
                cap.on = True
                before_ns, before_ops = cap.own_ns, cap.ops
                keep((size, name, "capture"), _loop(op, ops, sync))
                per = (cap.own_ns - before_ns) / max(1, cap.ops - before_ops) / 1e9
                own[(size, name)] = min(own.get((size, name), per), per)
    stop()
    sink.flush()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    for size in sizes:
        for name, op in kinds(size).items():
            for _ in range(rounds):
                keep((size, name, "bare"), _loop(op, ops, sync))
    profile, by_part = _profile(install, kinds(sizes[0]), ops) if parts else ([], [])
    captured = [e for e in events if e[0] in ("op", "alloc", "free", "stream")]
    analysis = RunAnalysis(None, {})
    start = time.perf_counter()
    analysis.feed(events)
    analysis.close()
    watching = (time.perf_counter() - start) / max(1, sum(e[0] == "op" for e in captured))
    for size in sizes:
        for name in kinds(size):
            bare = best[(size, name, "bare")]
            trace = best.get((size, name, "trace"))
            rows.append({
                "bytes": size, "op": name, "bare_us": bare * 1e6,
                "trace_us": None if trace is None else (trace - bare) * 1e6,
                "mode_us": (best[(size, name, "mode")] - bare) * 1e6,
                "capture_us": (best[(size, name, "capture")] - bare) * 1e6,
                "own_us": own[(size, name)] * 1e6})
    return {"device": device, "machine": _machine(torch, device), "ops": ops, "rounds": rounds,
            "rows": rows, "watching_us_per_op": watching * 1e6,
            "events": len(events), "findings": len(analysis.findings), "parts": profile,
            "by_part": by_part}


PARTS_SHOWN = 15


def _profile(install: Callable[[], Any], kinds: dict[str, Callable[[], Any]], ops: int
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Where the capture's time goes, over ``ops`` ops of each kind with the capture on: the
    functions that took the most of it, by their own time (cProfile's ``tottime``), and the
    capture's parts (:mod:`harness.capture.parts`)."""
    import cProfile
    import pstats
    stop = install()
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        for op in kinds.values():
            for _ in range(ops):
                op()
        profiler.disable()
    finally:
        stop()
    total = len(kinds) * ops
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [{"function": f"{func[2]} ({Path(func[0]).name}:{func[1]})", "calls": calls,
             "own_us_per_op": own / total * 1e6}
            for func, (_, calls, own, _, _) in stats.items()]
    rows.sort(key=lambda r: -r["own_us_per_op"])
    by_part = [{"part": p.part, "own_us_per_op": p.own_s / total * 1e6}
               for p in split_parts(stats)]
    return rows[:PARTS_SHOWN], by_part


LONG_LINES = 2000


def _at_the_end_of_a_long_function(torch: Any, a: Any, b: Any, c: Any) -> Callable[[], Any]:
    """``torch.add(a, b, out=c)`` at the end of a function :data:`LONG_LINES` lines long, as a
    model's long ``forward`` or a script's ``main`` calls its ops: the capture's cost per op
    must not grow with the length of the code that calls it."""
    body = "".join(f"    x{i} = {i}\n" for i in range(LONG_LINES))
    space: dict[str, Any] = {"torch": torch, "a": a, "b": b, "c": c}
    exec(compile(f"def op():\n{body}    torch.add(a, b, out=c)\n", "long.py", "exec"), space)
    return space["op"]  # type: ignore[no-any-return]


def _machine(torch: Any, device: str) -> str:
    where = torch.cuda.get_device_name() if device == "cuda" else (
        platform.processor() or platform.machine())
    return f"{where}, torch {torch.__version__}, Python {platform.python_version()}"


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['device']}: {result['machine']}; {result['ops']} ops a round, "
             f"fastest of {result['rounds']} rounds",
             "| tensor bytes | op | bare µs/op | + GPU trace µs | + dispatch mode µs | + capture "
             "µs | of which the source's own µs |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        trace = "-" if r["trace_us"] is None else f"{r['trace_us']:.2f}"
        lines.append(f"| {r['bytes']:,} | {r['op']} | {r['bare_us']:.2f} | {trace} "
                     f"| {r['mode_us']:.2f} | {r['capture_us']:.2f} | {r['own_us']:.2f} |")
    lines.append(f"watching side (translator and detector): {result['watching_us_per_op']:.2f} "
                 f"µs per captured op ({result['events']} events, {result['findings']} "
                 "findings)")
    if result["parts"]:
        lines += ["", "where the capture's time goes (cProfile, which slows what it times: "
                  "compare the parts, not the sums), own µs a captured op:",
                  "| function | calls | own µs/op |", "|---|---|---|"]
        lines += [f"| {p['function']} | {p['calls']:,} | {p['own_us_per_op']:.2f} |"
                  for p in result["parts"]]
        lines += ["", "by part:", "| part | own µs/op |", "|---|---|"]
        lines += [f"| {p['part']} | {p['own_us_per_op']:.2f} |" for p in result["by_part"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.capture.opcost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--ops", type=int, default=5000, help="ops a timed round (5000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (3)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES),
                        help="tensor sizes in bytes (4 KiB and 4 MiB)")
    parser.add_argument("--parts", action="store_true",
                        help="also profile the capture: the functions its time goes to")
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    opts = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("python -m harness.capture.opcost needs PyTorch in this interpreter",
              file=sys.stderr)
        return 77
    device = opts.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    result = measure(device, opts.ops, tuple(opts.sizes), opts.rounds, opts.parts)
    print(json.dumps(result, indent=2) if opts.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
