"""The watch benchmark: gpurace watch beside PyTorch's CUDA sanitizer on the same programs.

    python -m harness.capture.bench tests/watch_programs            (on a GPU machine)
    python -m harness.capture.bench tests/watch_programs --iters 400 --repeats 5 --json out.json

Each program is a file that takes ``--fixed`` (its fixed twin) and ``--iters N`` and prints
``work_s=SECONDS``, the wall time of its request loop alone (so process start, imports and the
CUDA context, which no tool changes, are left out). For each program this runs, side by side
(alternating, ``--repeats`` times, the median kept):

- the program bare;
- under PyTorch's CUDA sanitizer (``TORCH_CUDA_SANITIZER=1``; PyTorch programs only), which
  stops a program at the first race it reports ("CSAN detected a possible data race");
- under ``gpurace watch`` (the detector runs in the watching process; the program pays for the
  capture only).

Detection is each tool's verdict on the buggy program at its default size, and false reports
its verdict on the fixed twin; costs are each tool's work time over the bare program's, on the
fixed twin (the sanitizer ends a buggy program early). Nothing here is a test: the figures go
into docs/ and the closing notes, measured on the machine named in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_WORK = re.compile(r"work_s=([0-9.eE+-]+)")
CSAN = "CSAN detected a possible data race"


def run_command(argv: list[str], env: dict[str, str] | None = None, timeout: float = 600.0,
                cwd: Path | None = None) -> tuple[int, str, str]:
    """``argv``'s exit status, stdout and stderr, with ``env`` over this process's own."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})
    return done.returncode, done.stdout, done.stderr


def watch_argv(python: str, out_dir: Path, command: list[str], *options: str) -> list[str]:
    """``gpurace watch`` on ``command``, its run document on stdout (the program's own output
    then goes to the watch's stderr)."""
    return [python, "-m", "harness.cli", "watch", "--format", "json", "--out", str(out_dir),
            *options, "--", *command]


def watch_env() -> dict[str, str]:
    """The checkout first on PYTHONPATH, so the watch imports this gpurace."""
    return {"PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}


def _work(text: str) -> float | None:
    found = _WORK.findall(text)
    return float(found[-1]) if found else None


def bare(python: str, prog: Path, flags: list[str]) -> tuple[int, float | None, str]:
    code, out, err = run_command([python, str(prog), *flags])
    return code, _work(out), err


def sanitizer(python: str, prog: Path, flags: list[str]) -> tuple[bool, float | None, str]:
    code, out, err = run_command([python, str(prog), *flags], {"TORCH_CUDA_SANITIZER": "1"})
    return CSAN in err, _work(out), err


def watched(python: str, prog: Path, flags: list[str], out_dir: Path
            ) -> tuple[bool, float | None, dict[str, Any]]:
    code, out, err = run_command(watch_argv(python, out_dir, [python, str(prog), *flags]),
                                 watch_env())
    try:
        doc = json.loads(out)
        result = doc["results"][0]
    except (ValueError, KeyError, IndexError):
        return False, None, {"error": (err or out)[-2000:], "exit": code}
    # The program's own stdout went to the watch's stderr (--format json).
    return result["detected"] > 0, _work(err), {
        "exit": code, "findings": [f["missing"] for f in result["findings"]],
        "outcomes": result["outcomes"]}


_TORCH_IMPORT = re.compile(r"^\s*(?:import|from)\s+[\w., ]*\btorch\b", re.M)


def is_torch(prog: Path) -> bool:
    """Whether a program imports PyTorch (the sanitizer runs on PyTorch programs only)."""
    return _TORCH_IMPORT.search(prog.read_text()) is not None


def bench(programs: list[Path], python: str, iters: int, repeats: int,
          keep: Path | None = None) -> list[dict[str, Any]]:
    """Bench each program; with ``keep``, the rows so far are rewritten there after each one
    (a run stopped part way keeps what it measured)."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpurace-bench-") as tmp:
        out_dir = Path(tmp)
        for prog in programs:
            torch_prog = is_torch(prog)
            row: dict[str, Any] = {"program": prog.stem, "framework":
                                   "torch" if torch_prog else "cupy"}
            # Verdicts at the program's own size.
            for version, flags in (("buggy", []), ("fixed", ["--fixed"])):
                code, _, err = bare(python, prog, flags)
                row[f"{version}_bare_exit"] = code
                hit, _, info = watched(python, prog, flags, out_dir)
                row[f"{version}_gpurace"] = hit
                row[f"{version}_gpurace_info"] = info
                if torch_prog:
                    row[f"{version}_csan"] = sanitizer(python, prog, flags)[0]
            # Costs on the fixed twin, side by side.
            flags = ["--fixed", "--iters", str(iters)]
            times: dict[str, list[float]] = {"bare": [], "csan": [], "gpurace": []}
            for _ in range(repeats):
                t = bare(python, prog, flags)[1]
                if t:
                    times["bare"].append(t)
                if torch_prog:
                    t = sanitizer(python, prog, flags)[1]
                    if t:
                        times["csan"].append(t)
                t = watched(python, prog, flags, out_dir)[1]
                if t:
                    times["gpurace"].append(t)
            med = {k: statistics.median(v) for k, v in times.items() if v}
            row["work_s"] = med
            if "bare" in med:
                row["cost"] = {k: round(v / med["bare"], 3) for k, v in med.items()
                               if k != "bare"}
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)
            if keep:
                keep.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def _line(row: dict[str, Any]) -> str:
    def mark(key: str) -> str:
        return "-" if key not in row else ("yes" if row[key] else "no")
    cost = row.get("cost", {})
    return (f"| {row['program']} | {row['framework']} | {mark('buggy_gpurace')} | "
            f"{mark('fixed_gpurace')} | {mark('buggy_csan')} | {mark('fixed_csan')} | "
            f"{cost.get('gpurace', '-')} | {cost.get('csan', '-')} |")


HEADER = ("| program | framework | gpurace: buggy found | gpurace: fixed reported | "
          "CSAN: buggy found | CSAN: fixed reported | gpurace cost | CSAN cost |\n"
          "|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.capture.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("programs", type=Path, nargs="+",
                        help="program files, or folders of them")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--iters", type=int, default=200,
                        help="requests per timed run (the verdicts use the programs' own)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path,
                        help="also write the rows here, rewritten after each program")
    opts = parser.parse_args(argv)
    files = sorted(p for path in opts.programs for p in (
        path.glob("*.py") if path.is_dir() else [path]) if p.name != "conftest.py")
    print(HEADER, file=sys.stderr)
    rows = bench(files, opts.python, opts.iters, opts.repeats, opts.json)
    found = {k: sum(bool(r.get(k)) for r in rows) for k in (
        "buggy_gpurace", "fixed_gpurace", "buggy_csan", "fixed_csan")}
    torch_rows = sum(r["framework"] == "torch" for r in rows)
    print(f"gpurace found {found['buggy_gpurace']}/{len(rows)} buggy, reported "
          f"{found['fixed_gpurace']}/{len(rows)} fixed; CSAN found {found['buggy_csan']}/"
          f"{torch_rows} buggy, reported {found['fixed_csan']}/{torch_rows} fixed",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
