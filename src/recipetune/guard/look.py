"""What every look of one parity verdict shares (guard/looks.py: the seeds design and ``gather``;
guard/looks_steps.py: the steps design): the state a verdict's looks carry (``Looking``: its runs, its
costs, what it says), the runs a look wants, what the looks gathered, and how a look is said and ends."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from recipetune.core.console import Note
from recipetune.core.fmt import fmt_duration
from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.core.words import LooksStop, ParityOutcome, TrendOutcome
from recipetune.guard.baseline import BaselineProfile, GuardError
from recipetune.guard.config import GuardConfig
from recipetune.guard.parity import ParityEvidence
from recipetune.guard.runs import Runs, wait_all
from recipetune.workloads.base import Workload

Progress = Callable[[str], None]


@dataclass
class Gathered:
    evidence: ParityEvidence | None  # None: a candidate run failed
    failure: str  # the failed candidate run's status and cause
    runs: int  # training runs launched for the parity test (baseline and candidate)
    looks: list[str]  # the plan and what each look showed, for the verdict's notes
    reused: int = 0  # runs found stored (earlier verdicts in the same folder) or in flight for another verdict
    planned: int = 0  # runs the plan made before the candidate ran expected, were its batches other
    stop: LooksStop | str = ""  # why the looks ended ("": not run)
    plan: dict = field(default_factory=dict)  # the last plan: pairs, factor, runs and seconds still to go


@dataclass(frozen=True)
class Wanted:
    """One run a look needs: the baseline's or the candidate's, at seed (or repeat) k."""

    side: str  # "baseline" | "candidate"
    k: int
    recipe: Recipe
    steps: int
    out: Path  # its name in the verdict's folder


@dataclass
class Looking:
    """What every look of one verdict needs."""

    workload: Workload
    profile: BaselineProfile
    baseline: Recipe
    candidate: Recipe
    cand_steps: int
    settings: GuardConfig
    out_dir: Path
    equal_tokens: bool
    progress: Progress | None
    runs: Runs
    at_once: int
    run_s: float  # one run of the profile's length, in seconds (the profile's median)
    started: float = field(default_factory=time.monotonic)
    notes: list[str] = field(default_factory=list)

    def say(self, line: str, note: bool = True) -> None:
        if note:
            self.notes.append(line)
        if self.progress:
            self.progress(Note(line) if note else line)

    def seed(self, k: int) -> int | None:
        first = self.profile.seeds[0]
        return None if first is None else first + k

    def repeat(self, k: int) -> int:
        """Which repeat seed k is, for a trainer without a seed knob (guard/runs.py: the stored run's key)."""
        return k if self.profile.seeds[0] is None else 0

    def cost(self, recipe: Recipe, steps: int, k: int = 0) -> float:
        """A run's cost against guard.max_parity_runs, in runs of the profile's length; nothing if stored."""
        return 0.0 if self.runs.has(recipe, steps, self.repeat(k)) else steps / self.profile.steps

    def spent(self) -> float:
        return self.runs.steps_launched / self.profile.steps

    def seconds(self, runs: float) -> float:
        """Wall time of ``runs`` runs of the profile's length, ``at_once`` at a time."""
        return math.ceil(runs / self.at_once) * self.run_s if runs > 0 else 0.0

    def start(self, wanted: list[Wanted]) -> dict[tuple[str, int], Future[RunResult]]:
        """Start every run of a look at once: their futures by (side, k)."""
        return {(w.side, w.k): self.runs.start(w.recipe, w.steps, w.out, self.repeat(w.k)) for w in wanted}

    def gather(self, wanted: list[Wanted], look: int, futures: dict[tuple[str, int], Future[RunResult]] | None = None
               ) -> dict[tuple[str, int], RunResult] | str:
        """Every run of a look, to its end (``futures``: those already started); their results by (side, k),
        or the failed candidate's cause."""
        futures = futures if futures is not None else self.start(wanted)
        total = len(futures)

        def done(k: int) -> None:
            left = self.seconds(total - k) if total > k else 0.0
            self.say(f"parity look {look}: {k}/{total} runs done" + (f", ~{fmt_duration(left)} to go" if left else ""),
                     note=False)

        results = dict(zip(futures, wait_all(list(futures.values()), done), strict=True))
        for w in wanted:
            if (failed := self.failed(w, results[w.side, w.k])) is not None:
                return failed
        return results

    def failed(self, w: Wanted, result: RunResult) -> str | None:
        """The cause of a failed candidate run; a failed baseline run ends the verdict (GuardError)."""
        if result.ok:
            return None
        if w.side == "baseline":
            raise GuardError(f"baseline run failed ({result.status}: {result.cause}); see {w.out}")
        return f"candidate run failed at {w.out.name.replace('-', ' ')}: {result.status}: {result.cause}"


@dataclass(frozen=True)
class Stop:
    """Why the looks end: the line to say, and the reason the verdict gives instead of the parity test's own
    (None: the test's reasons say it)."""

    line: str
    reason: str | None = None


def stopped(v: Looking, ev: ParityEvidence, stop: Stop) -> None:
    """Say why the looks end, and give the verdict that reason."""
    v.say(stop.line)
    if stop.reason is not None:
        ev.reasons = [stop.reason]


def not_shown(ev: ParityEvidence, why: str) -> str:
    bounds = "" if ev.low is None else f", one-sided bounds [{ev.low:+.4f}, {ev.high:+.4f}]"
    resolve = "no difference" if ev.detectable is None else f"{ev.detectable:.4f} nats at best"
    return (f"not shown equivalent: final {ev.final_metric} {ev.mean_diff:+.4f} nats vs the baseline{bounds}, "
            f"T {ev.tolerance:.4f}; these runs resolve {resolve} (the smallest difference they detect); {why}")


def grows(ev: ParityEvidence) -> bool:
    """The parity test held on the mean but the gap is shown to grow (guard/trend.py): not approved, and more
    of the same evidence cannot change that. Only where the level held: a look that cannot resolve T yet is
    no verdict on the gap's trend either, and the next look tests both again (one noisy pair's slope must
    not end a verdict before the longer pairs that resolve T have run)."""
    return (ev.outcome == ParityOutcome.INCONCLUSIVE and ev.trend is not None
            and ev.trend.outcome == TrendOutcome.GROWS
            and bool(ev.measures) and all(x.outcome == ParityOutcome.HOLDS for x in ev.measures))


def look_line(look: int, what: str, level: float, ev: ParityEvidence) -> str:
    det = f"{ev.detectable:.4f}" if ev.detectable is not None else "unbounded"
    bounds = "" if ev.low is None else f" [{ev.low:+.4f}, {ev.high:+.4f}]"
    return (f"parity look {look} ({what}, one-sided level {level:.4g}): {ev.outcome}, difference "
            f"{ev.mean_diff:+.4f}{bounds}, detectable {det}, T {ev.tolerance:.4f}")

