"""The race window: how often a race manifests against the delay injected to widen it.

A ``--sweep`` run holds, per scenario variant, one result per injected delay. This module turns
them into points (rate and its Wilson 95% interval), measures the interpreter gap from the
sweep's kept traces (the host time from the delay's launch to the racing op that the delay must
outlast), and draws them: ``window.csv``, a PNG (matplotlib, the ``gpurace[plot]`` extra) and a
terminal rendering for when there is no matplotlib.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reports.atomic import atomic_writer
from reports.incident import TRACE, load_report, trace_records
from reports.junit import percent_interval
from reports.model import ReportError
from reports.timeline import racing_pairs

CSV_COLUMNS = ("scenario", "variant", "delay_us", "trials", "manifested", "rate", "low", "high")
BAR = 30
"""Characters of a full bar in the terminal rendering."""


@dataclass(frozen=True)
class Point:
    """One variant at one injected delay: ``manifested`` of ``trials``, and the Wilson 95%
    interval of that rate."""

    scenario: str
    variant: str
    delay_us: float
    trials: int
    manifested: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        return self.manifested / self.trials if self.trials else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "variant": self.variant, "delay_us": self.delay_us,
                "trials": self.trials, "manifested": self.manifested,
                "rate": round(self.rate, 6), "interval": [self.low, self.high]}


@dataclass(frozen=True)
class Window:
    """A sweep's points, in run order, and each scenario's interpreter gap in µs (the median
    over its kept traces; absent where no trace showed a race)."""

    points: tuple[Point, ...]
    gap_us: Mapping[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"points": [p.to_json() for p in self.points],
                "interpreter_gap_us": {k: round(v, 3) for k, v in self.gap_us.items()}}

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for p in self.points:
            writer.writerow([p.scenario, p.variant, f"{p.delay_us:g}", p.trials, p.manifested,
                             f"{p.rate:.6f}", f"{p.low:.6f}", f"{p.high:.6f}"])
        return out.getvalue()

    def curves(self) -> dict[tuple[str, str], list[Point]]:
        """Each (scenario, variant)'s points by delay."""
        out: dict[tuple[str, str], list[Point]] = {}
        for p in self.points:
            out.setdefault((p.scenario, p.variant), []).append(p)
        return {k: sorted(v, key=lambda p: p.delay_us) for k, v in out.items()}


def sweep_window(results: Iterable[Mapping[str, Any]],
                 gaps: Mapping[str, Sequence[float]] | None = None) -> Window:
    """The window of a run document's results (those a sweep made); ``gaps`` lists each
    scenario's measured interpreter gaps in µs."""
    points = []
    for r in results:
        if not r.get("sweep") or r.get("delay_us") is None or not r.get("trials"):
            continue
        low, high = r.get("manifested_interval") or (0.0, 1.0)
        points.append(Point(str(r["scenario"]), str(r["variant"]), float(r["delay_us"]),
                            int(r["trials"]), int(r.get("manifested", 0)), float(low),
                            float(high)))
    return Window(tuple(points), {k: statistics.median(v) for k, v in (gaps or {}).items() if v})


def interpreter_gap_us(records: Iterable[Mapping[str, Any]],
                       findings: Iterable[Mapping[str, Any]]) -> float | None:
    """In one trace: the host time from the delay's launch (the last delay kernel issued on
    the first racing op's stream before it; without one, the first racing op itself) to the
    second racing op's issue, in µs. None without a race or issue times."""
    pairs = racing_pairs(findings)
    if not pairs:
        return None
    ops = {int(r["seq"]): r for r in records if r.get("type", "op") == "op" and "seq" in r}
    first, second = ops.get(pairs[0][0]), ops.get(pairs[0][1])
    if first is None or second is None:
        return None
    start = first
    for seq in range(int(first["seq"]) - 1, 0, -1):
        op = ops.get(seq)
        if op is not None and op.get("stream") == first.get("stream"):
            if str(op.get("kind", "")).endswith("delay"):
                start = op
            break
    a, b = start.get("t_issue_ns"), second.get("t_issue_ns")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    return (b - a) / 1000


def trace_gaps(results: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The interpreter gaps of the traces a sweep kept (its incidents'), by scenario."""
    gaps: dict[str, list[float]] = {}
    for r in results:
        if not r.get("sweep"):
            continue
        for folder in r.get("reports") or []:
            try:
                report = load_report(Path(folder))
                records = trace_records(Path(folder) / TRACE)
            except (OSError, ReportError):
                continue  # an incident without a readable trace gives no gap
            gap = interpreter_gap_us(records, report.get("findings") or [])
            if gap is not None:
                gaps.setdefault(str(r["scenario"]), []).append(gap)
    return gaps


def render_terminal(window: Window) -> str:
    """The curves as text: a bar per delay, the rate and its interval."""
    lines = []
    for (scenario, variant), points in window.curves().items():
        gap = window.gap_us.get(scenario)
        lines.append(f"{scenario} [{variant}]" + (
            f"  (interpreter gap {gap:.1f} µs)" if gap is not None else ""))
        for p in points:
            filled = round(p.rate * BAR)
            mark = " <- gap" if gap is not None and _brackets(points, p, gap) else ""
            lines.append(f"  {p.delay_us:>8g} µs |{'█' * filled}{'·' * (BAR - filled)}| "
                         f"{p.manifested:>4}/{p.trials:<4} {100 * p.rate:5.1f}% "
                         f"[{percent_interval((p.low, p.high))}]{mark}")
    return "\n".join(lines)


def _brackets(points: Sequence[Point], p: Point, gap: float) -> bool:
    """Whether ``p`` is the first point at or beyond the gap."""
    beyond = [q for q in points if q.delay_us >= gap]
    return bool(beyond) and beyond[0] is p


def plot_png(window: Window, path: Path, title: str = "") -> None:
    """The window as a PNG: rate against delay (symmetric-log x, so 0 µs shows), a line per
    variant with Wilson 95% error bars, a panel per scenario, each gap a dashed line.
    Raises ImportError without matplotlib (``pip install gpurace[plot]``)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt

    curves = window.curves()
    scenarios = list(dict.fromkeys(s for s, _ in curves))
    fig, axes = plt.subplots(len(scenarios), 1, figsize=(7, 3.2 * len(scenarios)),
                             squeeze=False)
    for ax, scenario in zip(axes[:, 0], scenarios):
        for (s, variant), points in curves.items():
            if s != scenario:
                continue
            x = [p.delay_us for p in points]
            y = [100 * p.rate for p in points]
            err = [[100 * (p.rate - p.low) for p in points],
                   [100 * (p.high - p.rate) for p in points]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=variant)
        gap = window.gap_us.get(scenario)
        if gap is not None:
            ax.axvline(gap, linestyle="--", color="grey")
            ax.annotate(f"interpreter gap {gap:.0f} µs", (gap, 50), rotation=90,
                        textcoords="offset points", xytext=(-10, 0), va="center",
                        color="grey", fontsize=8)
        ax.set_xscale("symlog", linthresh=10)
        top = max(p.delay_us for p in window.points if p.scenario == scenario)
        ax.set_xlim(0, max(top * 1.4, 20))
        ax.set_ylim(-5, 105)
        ax.set_xlabel("injected delay (µs)")
        ax.set_ylabel("manifested (%)")
        ax.set_title(scenario)
        ax.grid(True, alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_writer(path, "wb") as file:
        fig.savefig(file, format="png", dpi=120)
    plt.close(fig)
