"""Trials of several kinds measured side by side: blocks of each kind in turn, so that what
drifts on a shared machine (its clock, its neighbours) touches every kind alike, and each
kind's figure is its median block."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def alternate(kinds: list[Callable[[int], bool]], trials: int, block: int,
              first: int = 0) -> tuple[list[float], list[int]]:
    """Blocks of ``block`` trials of each kind (given a trial's index, whether it counts) in
    turn, indexes from ``first``: the median seconds a trial of each kind, and how many of
    each counted."""
    seconds: list[list[float]] = [[] for _ in kinds]
    counts = [0] * len(kinds)
    index = first
    for _ in range(max(1, trials // block)):
        for k, run in enumerate(kinds):
            start = time.perf_counter()
            for _ in range(block):
                counts[k] += run(index)
                index += 1
            seconds[k].append((time.perf_counter() - start) / block)
    return [statistics.median(times) for times in seconds], counts
