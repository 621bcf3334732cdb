"""The quality job's decision on the test split, look by look (docs/finetune.md, "The decision").

The best node on validation and the baseline are trained again per seed and scored on test
(finetune/final.py, the one opener of the test split); the gain is paired by seed (same seed, same
data order). How many seeds, when to look and when to stop is the speed guard's machinery
(core/sequential.py), with this job's measure, the paired test-metric gain, and its threshold,
``search.min_gain``: ``GainDesign`` plans, looks and stops. This module runs the looks: it says the
plan before the first seed, trains (or reuses, on a resume) each look's seeds, keeps the time budget
and records what each look showed, for verdict.json, the terminal and the report.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from recipetune.core.recipe import Recipe
from recipetune.core.sequential import NEVER, GainDesign, GainLook
from recipetune.core.words import LookOutcome, LooksStop
from recipetune.engine.job import Services
from recipetune.finetune.final import evaluated, final_evaluation
from recipetune.finetune.plan import FinetuneCampaign, FinetuneSearchConfig
from recipetune.finetune.results import FinalResult


class LookRecord(BaseModel):
    """One look of the decision, as verdict.json keeps it."""

    look: int
    seeds: list[int]
    level: float  # the look's nominal one-sided level
    gain: float  # mean paired test gain (candidate - baseline)
    low: float  # its bound at the look's level: the gain is shown above the threshold when this is
    high: float
    outcome: LookOutcome  # shown | continue | futility | budget | plan
    planned: int  # seeds the plan counted on after this look
    next: int  # seeds of the next look ("continue")
    needed: int | None  # seeds that would show the gain seen at the stated power (None: none would)
    chance: float | None  # predictive power that the planned seeds show the gain
    trained: int  # runs this look trained (the rest of its 2 x seeds were reused)
    seconds: float  # wall time of this look's runs


def design_of(cfg: FinetuneSearchConfig) -> GainDesign:
    """The decision's design from the campaign's settings: one-sided (1 - confidence) / 2 in all its looks."""
    return GainDesign((1.0 - cfg.confidence) / 2.0, cfg.power, cfg.futility, cfg.min_gain, cfg.max_test_seeds,
                      cfg.spending, cfg.first_look)


def seed_list(cfg: FinetuneSearchConfig) -> list[int]:
    """The seeds the looks may use, in order: ``search.seeds`` (the first look), then the next integers."""
    extra = range(max(cfg.seeds) + 1, max(cfg.seeds) + 1 + cfg.max_test_seeds - len(cfg.seeds))
    return [*cfg.seeds, *extra][:cfg.max_test_seeds]


def pace(report: Any) -> float | None:
    """Seconds one seed of a recipe takes on the test split, at the pace of its validation run: it trains
    again and is evaluated on validation and on test (one evaluation more than the run it is timed by)."""
    t = getattr(report, "timings_s", None) or {}
    return t["total"] + t.get("eval", 0.0) if t.get("total") else None


def subset(result: FinalResult, seeds: list[int]) -> FinalResult | None:
    """A stored final evaluation narrowed to ``seeds``, if it holds them all."""
    if not set(seeds) <= set(result.seeds):
        return None
    at = [result.seeds.index(s) for s in seeds]
    values = [result.values[i] for i in at]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    metrics = [result.test_metrics[i] for i in at] if len(result.test_metrics) == len(result.seeds) else []
    return result.model_copy(update={"seeds": seeds, "values": values, "mean": mean, "std": std,
                                     "test_metrics": metrics, "runs": [result.runs[i] for i in at],
                                     "validation_values": [result.validation_values[i] for i in at]})


@dataclass
class Contender:
    """One of the two recipes the decision compares."""

    recipe: Recipe
    label: str  # "baseline" | "best node (lr=0.001)"
    report: Any  # its validation run's report: its pace
    result: FinalResult | None = None  # its test split over the last look's seeds


@dataclass
class SplitLooks:
    """One decision's looks: each trains (or reuses) both recipes' seeds and hands their paired gains
    to the design (``GainDesign.run``: ``draw`` and ``seen``)."""

    c: FinetuneCampaign
    services: Services
    pair: tuple[Contender, Contender]  # (baseline, best node)
    seeds: list[int] = field(default_factory=list)
    records: list[LookRecord] = field(default_factory=list)
    trained: int = 0  # runs the looks trained (the others compared were kept by an earlier session)
    stop: LooksStop | str = ""  # LooksStop.TIME where the time budget ended the looks
    _drawn: tuple[list[int], int, float] = ([], 0, 0.0)  # the last draw: seeds, runs trained, seconds
    _started: float = 0.0

    def __post_init__(self) -> None:
        self.seeds, self._started = seed_list(self.c.cfg), time.monotonic()

    def folder(self, who: Contender):
        return self.services.store.folder / "final" / who.recipe.id

    def kept(self, who: Contender) -> FinalResult | None:
        """What an earlier look or session kept of this recipe's test split (final.json)."""
        try:
            stored = FinalResult.model_validate_json((self.folder(who) / "final.json").read_text())
        except (OSError, ValueError):
            return None
        return stored if stored.experiment_id == self.c.space.experiment_of(who.recipe).id else None

    def pending(self, n: int) -> list[list[int]]:
        """Per recipe, the seeds of the first ``n`` not evaluated yet."""
        seeds = self.seeds[:n]
        out = []
        for who in self.pair:
            stored = self.kept(who)
            done = set(stored.seeds if stored else [])
            done |= set(evaluated(self.c.space.experiment_of(who.recipe), [s for s in seeds if s not in done],
                                  self.folder(who)))
            out.append([s for s in seeds if s not in done])
        return out

    def eta(self, pending: list[list[int]]) -> float | None:
        """Seconds these runs take at each recipe's own pace (None where one is unknown): the best node may
        train several times longer than the baseline (chat-recall's `epochs=4`: 152 s against 75 s)."""
        paces = [pace(who.report) for who in self.pair]
        if any(p is None for p, todo in zip(paces, pending, strict=True) if todo):
            return None
        return sum(len(todo) * (p or 0.0) for p, todo in zip(paces, pending, strict=True))

    def draw(self, n: int) -> list[float] | None:
        """The paired test gains of the first ``n`` seeds; None where the time budget ends the looks first."""
        seeds, todo = self.seeds[:n], self.pending(n)
        runs, ahead, budget = sum(map(len, todo)), self.eta(todo), self.c.cfg.max_test_s
        if budget is not None and runs and time.monotonic() - self._started + (ahead or 0.0) > budget:
            self.stop = LooksStop.TIME
            return None
        if runs:
            when = f", ~{ahead / 60:.1f} min at the two recipes' pace" if ahead is not None else ""
            self.services.reporter.phase(f"look {len(self.records) + 1}: seeds {seeds} on the test split, {runs} "
                                         f"run(s) to train{when}, {2 * n - runs} reused")
        start, trained = time.monotonic(), 0
        for who, todo_who in zip(self.pair, todo, strict=True):
            who.result, ran = self.final_for(who, seeds)
            trained += len(todo_who) if ran else 0
        assert self.pair[0].result is not None and self.pair[1].result is not None
        self.trained += trained
        self._drawn = (seeds, trained, time.monotonic() - start)
        return [c - b for b, c in zip(self.pair[0].result.values, self.pair[1].result.values, strict=True)]

    def final_for(self, who: Contender, seeds: list[int]) -> tuple[FinalResult, bool]:
        """The test split over ``seeds`` for one recipe, and whether it ran: what an earlier look or session
        kept of it, or final_evaluation (which itself reuses the seeds already evaluated)."""
        stored = self.kept(who)
        narrowed = subset(stored, seeds) if stored is not None else None
        if narrowed is not None:
            return narrowed, False
        exp = self.c.space.experiment_of(who.recipe)
        log = self.services.reporter.phase
        return self.services.executor.call(final_evaluation, None, exp, seeds, self.folder(who), log=log).result(), True

    def seen(self, look: GainLook) -> None:
        """Record a look and say what it showed."""
        seeds, runs, seconds = self._drawn
        self.records.append(LookRecord(
            look=look.look, seeds=seeds, level=look.level, gain=look.mean, low=look.low, high=look.high,
            outcome=look.outcome, planned=look.planned, next=look.next, chance=look.chance, trained=runs,
            needed=None if look.needed >= NEVER else look.needed, seconds=seconds))
        self.services.reporter.phase(look_line(self.records[-1], self.c.cfg.min_gain))

    @property
    def minutes(self) -> float:
        return sum(r.seconds for r in self.records) / 60.0


def look_line(r: LookRecord, threshold: float) -> str:
    """``look 1: 3 seeds, gain +0.0467, bound +0.0012 at level 0.0125 (threshold 0): continue to 5 seeds
    (plan 5) (chance 64%)``."""
    what = {LookOutcome.SHOWN: "shown above the threshold", LookOutcome.FUTILITY: "stopped for futility",
            LookOutcome.BUDGET: "stopped: the seeds it would need exceed the budget",
            LookOutcome.PLAN: "not shown at the planned seeds",
            LookOutcome.CONTINUE: f"continue to {r.next} seeds (plan {r.planned})"}[r.outcome]
    chance = f" (chance {r.chance:.0%})" if r.chance is not None else ""
    return (f"look {r.look}: {len(r.seeds)} seeds, gain {r.gain:+.4f}, bound {r.low:+.4f} at level {r.level:.4f} "
            f"(threshold {threshold:g}): {what}{chance}")
