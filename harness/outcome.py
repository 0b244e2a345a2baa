"""Trial and variant results: how each trial ended and what a variant's trials add up to."""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field


def step_shape(step: object) -> object:
    """A step with its numbers taken out: request 1 and request 2 are the same place, and a
    race found at both is one race."""
    return re.sub(r"\d+", "N", step) if isinstance(step, str) else step


class Outcome(str, enum.Enum):
    """How a trial ended (DESIGN.md, "Outcomes and expectations")."""

    CLEAN = "clean"
    CORRUPTION = "corruption"  # a check saw stale or torn data
    CRASH = "crash"            # a CUDA error; the context is dead
    HANG = "hang"              # the watchdog fired

    @property
    def manifested(self) -> bool:
        return self is not Outcome.CLEAN


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class TrialResult:
    """One trial. ``step`` is where it ended badly (a check's id, the step or request that
    crashed); ``request`` the 1-based request a workload crashed in, or how many it completed."""

    index: int
    seed: int
    outcome: Outcome
    detail: str = ""
    cuda_error: str | None = None
    step: str | None = None
    requests: int | None = None
    duration_s: float = 0.0
    race: bool = False
    worker_pid: int | None = None
    device_log: str = ""
    trace: str | None = None  # the trial's op trace (kept when it was not clean)
    ops_total: int = 0
    xids: list[dict[str, object]] = field(default_factory=list)
    findings: list[dict[str, object]] = field(default_factory=list)  # the race detector's

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["outcome"] = self.outcome.value
        return out

    @classmethod
    def from_json(cls, data: dict[str, object]) -> TrialResult:
        fields = dict(data)
        fields["outcome"] = Outcome(fields["outcome"])
        return cls(**fields)  # type: ignore[arg-type]


@dataclass
class VariantResult:
    """What one scenario variant's trials came to, and whether that met its expectation."""

    scenario: str
    variant: str
    expect: str
    path: str
    dangerous: bool
    amplified: bool
    delay_us: float | None
    status: Status = Status.SKIP
    reason: str = ""
    trials: list[TrialResult] = field(default_factory=list)
    min_rate: float = 0.0
    reports: list[str] = field(default_factory=list)
    sweep: bool = False

    @property
    def manifested(self) -> int:
        return sum(t.outcome.manifested for t in self.trials)

    @property
    def detected(self) -> int:
        return sum(t.race for t in self.trials)

    @property
    def reproduced(self) -> int:
        """Trials in which the race showed, by manifesting or by being detected."""
        return sum(t.outcome.manifested or t.race for t in self.trials)

    def outcomes(self) -> dict[str, int]:
        counts = {o.value: 0 for o in Outcome}
        for t in self.trials:
            counts[t.outcome.value] += 1
        return counts

    def judge(self) -> None:
        """Set status and reason from the trials and the expectation."""
        n = len(self.trials)
        if n == 0:
            self.status, self.reason = Status.SKIP, self.reason or "no trial ran"
        elif self.expect == "clean":
            bad = self.reproduced
            self.status = Status.PASS if bad == 0 else Status.FAIL
            shown = ", ".join(f"{k} {v}" for k, v in self.outcomes().items()
                              if v and k != Outcome.CLEAN.value)
            self.reason = "" if bad == 0 else (
                f"expected clean; {bad}/{n} trials were not ({shown or 'race detected'})")
        else:
            got = self.reproduced
            rate = got / n
            if got and rate >= self.min_rate:
                self.status, self.reason = Status.PASS, ""
            else:
                self.status = Status.FAIL
                self.reason = (f"expected to reproduce in at least {self.min_rate:.0%} of trials; "
                               f"reproduced in {got}/{n}: the harness lost its power here")

    def xid_summary(self) -> list[dict[str, object]]:
        """Each Xid seen in this variant's trials, once: number, meaning, class, and in how
        many trials it came."""
        seen: dict[object, dict[str, object]] = {}
        for t in self.trials:
            for x in {int(x["xid"]): x for x in t.xids}.values():  # type: ignore[call-overload]
                entry = seen.setdefault(x["xid"], {"xid": x["xid"], "meaning": x.get("meaning"),
                                                   "class": x.get("class"), "trials": 0})
                entry["trials"] = int(entry["trials"]) + 1  # type: ignore[call-overload]
        return list(seen.values())

    def finding_summary(self, most: int = 5) -> list[dict[str, object]]:
        """The detector's findings across trials, folded by the ops that raced: each once,
        with in how many trials it was found."""
        folded: dict[tuple[object, ...], dict[str, object]] = {}
        for t in self.trials:
            for f in t.findings:
                first, second = f["first"], f["second"]  # type: ignore[index]
                key = (f["buffer"], first["stream"], first["kind"],  # type: ignore[index]
                       step_shape(first["step"]), second["stream"],  # type: ignore[index]
                       second["kind"], step_shape(second["step"]))  # type: ignore[index]
                entry = folded.setdefault(key, {**f, "trials": 0})
                entry["trials"] = int(entry["trials"]) + 1  # type: ignore[call-overload]
        return sorted(folded.values(), key=lambda f: -int(f["trials"]))[:most]  # type: ignore

    def to_json(self) -> dict[str, object]:
        first = next((t for t in self.trials if t.outcome.manifested), None)
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "status": self.status.value,
            "expect": self.expect,
            "trials": len(self.trials),
            "manifested": self.manifested,
            "detected": self.detected,
            "outcomes": self.outcomes(),
            "reports": list(self.reports),
            "reason": self.reason,
            "path": self.path,
            "dangerous": self.dangerous,
            "amplified": self.amplified,
            "delay_us": self.delay_us,
            "min_rate": self.min_rate,
            "sweep": self.sweep,
            "first_manifested": None if first is None else first.to_json(),
            "traces": [t.trace for t in self.trials if t.trace],
            "crash_requests": [t.requests for t in self.trials
                               if t.outcome is Outcome.CRASH and t.requests is not None],
            "xids": self.xid_summary(),
            "findings": self.finding_summary(),
        }
