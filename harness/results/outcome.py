"""Trial and variant results: how each trial ended and what a variant's trials add up to."""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from harness.results.rates import wilson
from harness.words import counted


def step_shape(step: object) -> object:
    """A step with its numbers taken out: request 1 and request 2 are the same place, and a
    race found at both is one race. A watched program's step is its ``file.py:LINE``, a place
    already: it stays as it is (two lines are two races)."""
    if not isinstance(step, str) or is_site(step):
        return step
    return re.sub(r"\d+", "N", step)


_SITE = re.compile(r".+\.py:\d+")


def is_site(step: str) -> bool:
    """Whether a step is a Python ``file.py:LINE`` (a watched program's op), not a scenario's
    step id."""
    return _SITE.fullmatch(step) is not None


class Outcome(str, enum.Enum):
    """How a trial ended: clean, corruption (a check saw stale or torn data), crash (a CUDA
    error; the context is dead) or hang (the watchdog fired). Whether the detector found a race
    is told apart, on the trial."""

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
    # Issued again from the device program an earlier clean trial captured, not step by step
    # (see harness.run.executor): the same calls, with less of the harness between them.
    reissued: bool = False

    def to_json(self) -> dict[str, object]:
        # By hand, not dataclasses.asdict: its deep copy cost as much as a trial's ops. Its
        # fields are its __dict__, in order.
        out = self.__dict__.copy()
        # The enum's own field: its ``value`` is a property, a call for every trial.
        out["outcome"] = self.outcome._value_
        if self.xids:  # most trials have none: no comprehension (a call of its own) made
            out["xids"] = [dict(x) for x in self.xids]
        else:
            out["xids"] = []
        if self.findings:
            out["findings"] = [dict(f) for f in self.findings]
        else:
            out["findings"] = []
        return out

    @classmethod
    def from_json(cls, data: dict[str, object]) -> TrialResult:
        fields = dict(data)
        fields["outcome"] = Outcome(fields["outcome"])
        return cls(**fields)  # type: ignore[arg-type]


_DIGEST_MOD = 2 ** 256
"""Trial hashes add up modulo the size of one sha256: the sum keeps a digest's width."""

CRASH_REQUESTS_KEPT = 10_000
"""Crash requests (and restart times) a variant's result lists (a soak may crash far more
often)."""


@dataclass
class VariantResult:
    """What one scenario variant's trials came to, and whether that met its expectation.

    Trials are added one by one (:meth:`add`) and folded into running counts, so a run of
    20,000 trials costs the same per trial as one of 20, and keeps no more memory: the first
    trial that went wrong, the folded findings and Xids, the counts, and a digest of every
    trial's (index, seed, outcome, detail) that says whether two runs did the same thing.

    Everything folded adds up across shards: :meth:`absorb` takes another part of the same
    variant's trials (from its run document, :meth:`from_json`) and gives what one run of all
    the trials would have given. So the digest is order-free, a sum of one hash per trial: each
    trial's index is in its hash, so no order is lost that matters."""

    scenario: str
    variant: str
    expect: str
    path: str
    dangerous: bool
    amplified: bool
    delay_us: float | None
    status: Status = Status.SKIP
    reason: str = ""
    trials: int = 0
    wall_s: float = 0.0  # the trials' durations added up: what the variant cost in seconds
    min_rate: float = 0.0
    reports: list[str] = field(default_factory=list)
    sweep: bool = False
    counts: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome})
    detected: int = 0
    reproduced: int = 0
    not_clean: int = 0  # trials that manifested or had a race found (one count per trial)
    reissued: int = 0  # trials issued again from a captured device program
    first_manifested: TrialResult | None = None
    traces: list[str] = field(default_factory=list)
    crash_requests: list[int] = field(default_factory=list)
    restart_s: list[float] = field(default_factory=list)  # worker death to the next hand-over
    _findings: dict[tuple[object, ...], dict[str, object]] = field(default_factory=dict)
    _xids: dict[object, dict[str, object]] = field(default_factory=dict)
    _digest: int = 0

    def add(self, trial: TrialResult) -> None:
        """Fold one finished trial into the counts."""
        self.trials += 1
        self.wall_s += trial.duration_s
        self.counts[trial.outcome.value] += 1
        self.detected += trial.race
        self.reissued += trial.reissued
        self.not_clean += trial.outcome.manifested or trial.race
        self.reproduced += self.counts_as_reproduced(trial)
        # The lowest index, not the first to end: lanes end trials out of order.
        if trial.outcome.manifested and (self.first_manifested is None
                                         or trial.index < self.first_manifested.index):
            self.first_manifested = trial
        if trial.trace:
            self.traces.append(trial.trace)
        if trial.outcome is Outcome.CRASH and trial.requests is not None \
                and len(self.crash_requests) < CRASH_REQUESTS_KEPT:
            self.crash_requests.append(trial.requests)
        for f in trial.findings:
            self._fold_finding(f, 1)
        for x in {int(x["xid"]): x for x in trial.xids}.values():  # type: ignore[call-overload]
            self._fold_xid(x, 1)
        line = f"{trial.index}:{trial.seed}:{trial.outcome.value}:{trial.detail}\n"
        self._digest = (self._digest + int.from_bytes(
            hashlib.sha256(line.encode()).digest(), "big")) % _DIGEST_MOD

    def add_restart(self, seconds: float) -> None:
        """A worker died and the next one was handed the trials ``seconds`` later."""
        if len(self.restart_s) < CRASH_REQUESTS_KEPT:
            self.restart_s.append(round(seconds, 6))

    def _fold_finding(self, f: dict[str, object], trials: int) -> None:
        first, second = f["first"], f["second"]
        key = (f["buffer"], first["stream"], first["kind"],  # type: ignore[index]
               step_shape(first["step"]), second["stream"],  # type: ignore[index]
               second["kind"], step_shape(second["step"]))  # type: ignore[index]
        entry = self._findings.setdefault(key, {**f, "trials": 0})
        entry["trials"] = int(entry["trials"]) + trials  # type: ignore[call-overload]

    def _fold_xid(self, x: dict[str, object], trials: int) -> None:
        entry = self._xids.setdefault(x["xid"], {"xid": x["xid"], "meaning": x.get("meaning"),
                                                 "class": x.get("class"), "trials": 0})
        entry["trials"] = int(entry["trials"]) + trials  # type: ignore[call-overload]

    def counts_as_reproduced(self, trial: TrialResult) -> bool:
        """Whether the race showed in this trial. A hang shows only that the trial hung: it
        counts where the variant expects a hang, and not as a race reproduced."""
        if self.expect == "hang":
            return trial.outcome is Outcome.HANG
        return (trial.outcome.manifested and trial.outcome is not Outcome.HANG) or trial.race

    @property
    def manifested(self) -> int:
        return self.trials - self.counts[Outcome.CLEAN.value]

    @property
    def digest(self) -> str:
        """The sum, modulo 2**256, of the sha256 of each trial's index, seed, outcome and
        detail, as 64 hex digits: equal for two runs that did the same trials the same way, in
        whatever order or shards."""
        return f"{self._digest:064x}"

    @property
    def interval(self) -> tuple[float, float]:
        """The Wilson 95% interval of the manifestation rate."""
        return wilson(self.manifested, self.trials)

    def outcomes(self) -> dict[str, int]:
        return dict(self.counts)

    def judge(self) -> None:
        """Set status and reason from the trials and the expectation."""
        n = self.trials
        if n == 0:
            self.status, self.reason = Status.SKIP, self.reason or "no trial ran"
        elif self.expect == "clean":
            bad = self.not_clean
            self.status = Status.PASS if bad == 0 else Status.FAIL
            shown = ", ".join(f"{k} {v}" for k, v in self.counts.items()
                              if v and k != Outcome.CLEAN.value)
            self.reason = "" if bad == 0 else (
                f"expected clean; {bad} of {counted(n, 'trial')} not clean "
                f"({shown or 'race detected'})")
        else:
            got = self.reproduced
            rate = got / n
            if got and rate >= self.min_rate:
                self.status, self.reason = Status.PASS, ""
                return
            self.status = Status.FAIL
            hung = self.counts[Outcome.HANG.value]
            if self.expect == "hang":
                self.reason = (f"expected to hang in at least {self.min_rate:.0%} of trials; "
                               f"hung in {got}/{n}")
            else:
                self.reason = (f"expected to reproduce in at least {self.min_rate:.0%} of "
                               f"trials; reproduced in {got}/{n}: the race no longer shows "
                               "(the known bug is fixed here, or the amplification no longer "
                               "widens its window)"
                               + (f" ({counted(hung, 'trial')} hung, which is not a "
                                  "reproduction: say `expect: hang` if the variant is meant "
                                  "to hang)"
                                  if hung else ""))

    def xid_summary(self) -> list[dict[str, object]]:
        """Each Xid seen in this variant's trials, once: number, meaning, class, and in how
        many trials it came."""
        return list(self._xids.values())

    def finding_summary(self, most: int | None = None) -> list[dict[str, object]]:
        """The detector's findings across trials, folded by the ops that raced: each once,
        with in how many trials it was found, the most found first."""
        return sorted(self._findings.values(),
                      key=lambda f: -int(f["trials"]))[:most]  # type: ignore[call-overload]

    def to_json(self) -> dict[str, object]:
        first = self.first_manifested
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "status": self.status.value,
            "expect": self.expect,
            "trials": self.trials,
            "wall_s": round(self.wall_s, 6),
            "manifested": self.manifested,
            "manifested_interval": [round(x, 6) for x in self.interval],
            "detected": self.detected,
            "reproduced": self.reproduced,
            "not_clean": self.not_clean,
            "reissued": self.reissued,
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
            "traces": list(self.traces),
            "crash_requests": list(self.crash_requests),
            "restart_s": list(self.restart_s),
            "xids": self.xid_summary(),
            "findings": self.finding_summary(),
            "digest": self.digest,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> VariantResult:
        """A variant's result as its run document wrote it, ready to :meth:`absorb` more."""
        first = doc.get("first_manifested")
        out = cls(
            scenario=doc["scenario"], variant=doc["variant"], expect=doc["expect"],
            path=doc["path"], dangerous=doc["dangerous"], amplified=doc["amplified"],
            delay_us=doc["delay_us"], status=Status(doc["status"]), reason=doc["reason"],
            trials=doc["trials"], wall_s=doc["wall_s"], min_rate=doc["min_rate"],
            reports=list(doc["reports"]), sweep=doc["sweep"], counts=dict(doc["outcomes"]),
            detected=doc["detected"], reproduced=doc["reproduced"], not_clean=doc["not_clean"],
            reissued=doc.get("reissued", 0),
            first_manifested=None if first is None else TrialResult.from_json(first),
            traces=list(doc["traces"]), crash_requests=list(doc["crash_requests"]),
            restart_s=list(doc["restart_s"]), _digest=int(doc["digest"], 16))
        for f in doc["findings"]:
            out._fold_finding(f, int(f["trials"]))  # the entry's own count is replaced
        for x in doc["xids"]:
            out._fold_xid(x, int(x["trials"]))
        return out

    def absorb(self, other: VariantResult) -> None:
        """Add another part of this variant's trials (another shard's): counts, findings, Xids
        and digest add up, the first manifested trial is the one of lowest index, and the
        verdict is judged again over all of them."""
        self.trials += other.trials
        self.wall_s += other.wall_s
        for outcome, n in other.counts.items():
            self.counts[outcome] = self.counts.get(outcome, 0) + n
        self.detected += other.detected
        self.reproduced += other.reproduced
        self.not_clean += other.not_clean
        self.reissued += other.reissued
        firsts = [t for t in (self.first_manifested, other.first_manifested) if t is not None]
        self.first_manifested = min(firsts, key=lambda t: t.index, default=None)
        self.reports += other.reports
        self.traces += other.traces
        self.crash_requests = (self.crash_requests + other.crash_requests)[:CRASH_REQUESTS_KEPT]
        self.restart_s = (self.restart_s + other.restart_s)[:CRASH_REQUESTS_KEPT]
        for f in other._findings.values():
            self._fold_finding(f, int(f["trials"]))
        for x in other._xids.values():
            self._fold_xid(x, int(x["trials"]))
        self._digest = (self._digest + other._digest) % _DIGEST_MOD
        if self.trials:  # else both parts were skipped, and say why
            self.status, self.reason = Status.SKIP, ""
            self.judge()
