"""The progress callbacks a run or a watch calls as its trials go: the engine's only way to
speak to whoever runs it (the CLI subclasses :class:`RunHooks`)."""

from __future__ import annotations

from harness.results.outcome import TrialResult, VariantResult
from harness.results.watched import WatchedRun


class RunHooks:
    """Progress callbacks; the CLI subclasses this. Every method is optional."""

    def variant_started(self, result: VariantResult, trials: int) -> None: ...

    def trial_finished(self, result: VariantResult, trial: TrialResult) -> None: ...

    def run_finished(self, result: VariantResult, trial: TrialResult, run: WatchedRun) -> None:
        """One run of a watched program ended: its trial, and the watch's own record of it
        (whether the analysis failed, its children). By default, just the trial."""
        self.trial_finished(result, trial)

    def variant_finished(self, result: VariantResult) -> None: ...

    def note(self, text: str) -> None: ...
