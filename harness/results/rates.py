"""How sure a rate is: the Wilson score interval of k successes in n trials.

A manifestation rate from 50 trials is a measurement with an error bar, and two runs (one whole,
one merged from shards, or one on sim and one on a GPU) can only be compared with the bar in
view. Wilson's interval keeps to [0, 1] and stays honest at 0/n and n/n, where the plain
normal interval collapses to a point.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95% interval."""


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes in ``n`` trials, as ``(low, high)``;
    ``(0.0, 1.0)`` when there are no trials, since nothing is known."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # At 0/n and n/n the formula's end is the bound itself, up to rounding: say it exactly.
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return low, high

