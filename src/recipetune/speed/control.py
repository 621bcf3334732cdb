"""The control system as the speed job sees it: ``Guard``, a typed boundary around recipetune.guard
(its answers are the guard's own models; tests substitute fakes that return the same shapes), and
``RealGuard``, the guard itself. speed/job.py runs it; speed/decide.py asks it for final verdicts."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.execute.executor import Executor

if TYPE_CHECKING:
    from recipetune.guard.baseline import BaselineProfile
    from recipetune.guard.config import GuardConfig
    from recipetune.guard.screen import Screening
    from recipetune.guard.static import Violation
    from recipetune.guard.verdict import Verdict
    from recipetune.workloads.base import Workload


class Guard(Protocol):
    """The guard's entry points (recipetune.guard), typed by what they return."""

    def static_check(self, workload: Workload, baseline: Recipe, candidate: Recipe,
                     allow_semantic: Collection[str] = ()) -> list[Violation]: ...

    def profile_baseline(self, workload: Workload, recipe: Recipe, steps: int, settings: GuardConfig,
                         out_dir: Path, progress: Callable[[str], None] | None = None,
                         runs_folder: Path | None = None) -> BaselineProfile: ...

    def screen(self, profile: BaselineProfile, candidate: RunResult, settings: GuardConfig) -> Screening: ...

    def final_verdict(self, workload: Workload, baseline: Recipe, candidate: Recipe, settings: GuardConfig,
                      out_dir: Path, allow_semantic: Collection[str] = (), profile: BaselineProfile | None = None,
                      progress: Callable[[str], None] | None = None, executor: Executor | None = None,
                      runs_folder: Path | None = None) -> Verdict: ...

    def keep_run(self, workload: Workload, recipe: Recipe, steps: int, result: RunResult,
                 runs_folder: Path) -> bool:
        """Keep a search trial's run in the runs folder, where a final verdict's first candidate run
        at the same recipe, seed and steps finds it: whether it was kept."""

    def load_profile(self, text: str) -> BaselineProfile:
        """A profile read back from baseline_profile.json (a resume)."""

    def load_verdict(self, data: dict[str, Any]) -> Verdict:
        """A verdict read back from verdicts.json (a resume)."""


class RealGuard:
    """recipetune.guard itself. Its modules load on first use: scipy and the guard stay out of a
    command that never reaches them. A module-level class, so a bound method pickles to a Ray worker."""

    def static_check(self, workload: Workload, baseline: Recipe, candidate: Recipe,
                     allow_semantic: Collection[str] = ()) -> list[Violation]:
        from recipetune.guard.static import static_check

        return static_check(workload, baseline, candidate, allow_semantic)

    def profile_baseline(self, workload: Workload, recipe: Recipe, steps: int, settings: GuardConfig,
                         out_dir: Path, progress: Callable[[str], None] | None = None,
                         runs_folder: Path | None = None) -> BaselineProfile:
        from recipetune.guard.baseline import profile_baseline
        from recipetune.guard.runs import Runs

        runs = Runs(workload, folder=runs_folder, progress=progress) if runs_folder is not None else None
        return profile_baseline(workload, recipe, steps, settings, out_dir, progress=progress, runs=runs)

    def screen(self, profile: BaselineProfile, candidate: RunResult, settings: GuardConfig) -> Screening:
        from recipetune.guard.screen import screen

        return screen(profile, candidate, settings)

    def final_verdict(self, workload: Workload, baseline: Recipe, candidate: Recipe, settings: GuardConfig,
                      out_dir: Path, allow_semantic: Collection[str] = (), profile: BaselineProfile | None = None,
                      progress: Callable[[str], None] | None = None, executor: Executor | None = None,
                      runs_folder: Path | None = None) -> Verdict:
        from recipetune.guard.verdict import final_verdict

        return final_verdict(workload, baseline, candidate, settings, out_dir, allow_semantic=allow_semantic,
                             profile=profile, progress=progress, executor=executor, runs_folder=runs_folder)

    def keep_run(self, workload: Workload, recipe: Recipe, steps: int, result: RunResult,
                 runs_folder: Path) -> bool:
        from recipetune.guard.runs import Runs

        return Runs(workload, folder=runs_folder).adopt(recipe, steps, result)

    def load_profile(self, text: str) -> BaselineProfile:
        from recipetune.guard.baseline import BaselineProfile

        return BaselineProfile.model_validate_json(text)

    def load_verdict(self, data: dict[str, Any]) -> Verdict:
        from recipetune.guard.verdict import Verdict

        return Verdict.model_validate(data)


def real_guard() -> Guard:
    return RealGuard()
