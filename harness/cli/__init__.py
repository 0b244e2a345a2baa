"""The gpurace command line: the only package that parses argv or prints.

    gpurace list                         what scenarios and suites there are
    gpurace run smoke                    the safe suite on the best backend here
    gpurace run scenarios/ --dangerous   every scenario, dangerous ones too (GPU you may crash)

A module per command or family of commands, each with its options and its output together;
what several share lives in ``options`` (their options, declared once) and ``output`` (how they
print). ``app`` holds the group they register on, :data:`main`, the console script.
"""

from __future__ import annotations

from harness.cli import catalog, doctor, explore, minimize, report, runs, traces, watch
from harness.cli.app import main


__all__ = ["main", "catalog", "doctor", "explore", "minimize", "report", "runs", "traces",
           "watch"]
