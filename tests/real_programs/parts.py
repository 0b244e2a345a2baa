"""Where gpurace's time goes in a watched corpus program, by part of the capture.

    python tests/real_programs/parts.py --only fsdp2_train lightning_fit      (on a GPU machine)

Each entry runs once under ``gpurace watch`` as ``python -m cProfile -o F SCRIPT ARGS``: the
program profiled with the capture inside it. The profile's functions are taken apart by
:mod:`harness.capture.parts` (the mode's entry, the op's tensors and stream, the walk out to
the program's line, naming, PyTorch's callbacks, the sink, ...), and each part's own time is
said per op the capture handled over the whole run (its ``stats`` event). cProfile slows small
functions most, so compare the parts with each other; ``bench.py`` measures what the capture
costs unprofiled. The watching side (translator, detector) runs in the watch's own process and
is not in this profile. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import pstats
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: this checkout's harness and tests
    sys.path.insert(0, str(ROOT))

from harness.capture.bench import run_command, watch_argv, watch_env  # noqa: E402
from harness.capture.parts import split, table  # noqa: E402
from tests.real_runs import (CORPUS_FILE, capture_stats, command,  # noqa: E402
                             load_corpus)


def profile_entry(entry: object, python: str, corpus: Path, iters: int | None, timeout: float,
                  folder: Path) -> str:
    """One watched, profiled run of ``entry``: its parts as a Markdown table, or why none."""
    prof = folder / "program.prof"
    program = command(entry, python, corpus, iters)
    argv = watch_argv(python, folder / "out", [program[0], "-m", "cProfile", "-o", str(prof),
                                               *program[1:]], "--runs", "1",
                      "--timeout", f"{timeout:g}")
    code, out, err = run_command(argv, watch_env(), timeout + 120, cwd=ROOT)
    try:
        events = Path(json.loads(out)["watch"]["runs"][0]["events"])
    except (ValueError, KeyError, IndexError, TypeError):
        return f"the watch wrote no run document (exit {code}): {err.strip()[-500:]}"
    if not prof.is_file():
        return f"no profile written (watch exit {code}): {err.strip()[-500:]}"
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    ops = 0
    for source in ("torch", "cupy"):
        said = capture_stats(events, source) if events.is_file() else None
        ops += int(said.get("ops", 0)) if said else 0
    total = sum(v[2] for v in stats.values())
    return table(split(stats), ops, total)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/real_programs/parts.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", required=True,
                        help="the corpus entries to profile")
    parser.add_argument("--iters", type=int, help="passed on to each program")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=300.0, help="a run's limit, seconds")
    parser.add_argument("--corpus", type=Path, default=CORPUS_FILE, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    entries = {e.name: e for e in load_corpus(opts.corpus)}
    unknown = sorted(set(opts.only) - set(entries))
    if unknown:
        parser.error(f"--only: no entry {unknown}; the corpus has {sorted(entries)}")
    for name in opts.only:
        with tempfile.TemporaryDirectory(prefix="gpurace-parts-") as tmp:
            print(f"## {name}\n")
            print(profile_entry(entries[name], opts.python, opts.corpus, opts.iters,
                                opts.timeout, Path(tmp)), "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
