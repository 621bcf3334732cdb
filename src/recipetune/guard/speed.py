"""Throughput significance: baseline and candidate measured interleaved, the speed-up with its CI.

Pairs alternate their order (A B, B A, A B, ...), so a shared machine's drift falls on both sides
of a pair and a first-run or last-run effect on neither side alone. Warm-up steps are excluded from
tokens/s and reported apart; each run's figure is the median over windows of its steps
(``measure.robust_rate``), so one stall moves it little, and stalls are counted per run. Consecutive
baseline runs are A/A pairs: with the stored profile's (when plausible) they give the noise margin.
An A/A noise above ``speed.max_noise`` is refused: the pairs are measured once more, and if the
noise is still absurd the verdict says the machine was busy instead of deciding.
``smallest_approvable`` states the test's power: the smallest speed-up these pairs could have approved.

Two looks (``speed.first_pairs``, then ``speed.pairs``): a gain whose interval already clears the
margin after the first pairs is approved there, and one whose interval already lies below it is
kept there; the two looks spend the interval's level by Lan-DeMets Pocock spending
(guard/sequential.py), so stopping early keeps the stated confidence.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from recipetune.core import clock, stats
from recipetune.core.clock import ClockChoice
from recipetune.core.console import Note
from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.core.sequential import Spending, spent
from recipetune.guard.baseline import GuardError
from recipetune.guard.config import GuardConfig
from recipetune.workloads.base import Workload


class Pair(BaseModel):
    index: int
    order: str  # "AB": baseline first, "BA": candidate first
    baseline_tokens_per_s: float
    candidate_tokens_per_s: float
    ratio: float
    baseline_warmup_s: float
    candidate_warmup_s: float
    baseline_dir: str
    candidate_dir: str
    baseline_stalls: int = 0
    candidate_stalls: int = 0
    # what the trainer printed, where the figures above are on the guard's own clock (core/clock.py)
    baseline_claimed_tokens_per_s: float | None = None
    candidate_claimed_tokens_per_s: float | None = None


class SpeedEvidence(BaseModel):
    pairs: list[Pair]
    speedup: float | None  # geometric mean of the per-pair ratios
    ci_low: float | None
    ci_high: float | None
    confidence: float
    ci_method: str
    noise_margin: float
    noise_source: str  # "configured" or "A/A: N baseline-vs-baseline ratios"
    aa_log_ratios: list[float]
    faster: bool  # the CI's lower end clears 1 + noise margin
    # the power of these pairs: the smallest speed-up they could have approved (their scatter, the margin)
    smallest_approvable: float | None = None
    failure: str = ""  # a candidate run that failed: then nothing else here counts
    busy: str = ""  # the A/A noise stayed absurd after measuring again: no decision on speed
    notes: list[str] = []  # a refused stored noise, a re-measurement, each look
    timed_by: str = "trainer"  # whose clock the pairs' figures are on: "trainer" or "guard" (core/clock.py)
    clock: str = ""  # why: the trainer's times agree with the guard's clock, or how they disagree


Runs = list[tuple[RunResult, RunResult]]  # each pair's (baseline, candidate) runs


def _pairs(workload: Workload, baseline: Recipe, candidate: Recipe, settings: GuardConfig, out_dir: Path,
           progress: Callable[[str], None] | None, first: int = 0, count: int | None = None) -> tuple[Runs, str]:
    """Interleaved pairs ``first`` .. ``first + count``; a failed candidate run ends them (its message is
    returned)."""
    sp = settings.speed
    pairs: Runs = []
    for i in range(first, first + (sp.pairs if count is None else count)):
        order = _order(i)
        runs: dict[str, RunResult] = {}
        for side in order:
            name = "baseline" if side == "A" else "candidate"
            if progress:
                progress(f"speed pair {i + 1}/{sp.pairs}: {name}")
            folder = out_dir / f"pair-{i + 1}" / name
            recipe = baseline if side == "A" else candidate
            result = workload.run(recipe, sp.steps, folder, timeout_s=settings.timeout_s)
            if not result.ok and side == "A":
                raise GuardError(f"baseline speed run failed ({result.status}: {result.cause}); see {folder}")
            if not result.ok:
                return pairs, f"candidate speed run {result.status}: {result.cause}"
            runs[side] = result
        pairs.append((runs["A"], runs["B"]))
    return pairs, ""


def _order(i: int) -> str:
    """Pair ``i``'s order: the baseline first in every other pair, so a drift of the machine cancels."""
    return "AB" if i % 2 == 0 else "BA"


def timed(runs: Runs, choice: ClockChoice) -> list[Pair]:
    """The pairs' figures on the clock ``choice`` names (the trainer's printed times kept beside the guard's)."""
    pairs = []
    for i, (base, cand) in enumerate(runs):
        a, b = base.summary(False), cand.summary(False)
        ta, tb = (choice.rate(base), choice.rate(cand)) if choice.guard else \
            (a.tokens_per_s_per_device, b.tokens_per_s_per_device)  # the trainer's: the summaries above
        pairs.append(Pair(
            index=i + 1, order=_order(i),
            baseline_tokens_per_s=ta, candidate_tokens_per_s=tb, ratio=tb / ta,
            baseline_warmup_s=a.warmup_time_s, candidate_warmup_s=b.warmup_time_s,
            baseline_dir=base.out_dir, candidate_dir=cand.out_dir,
            baseline_stalls=a.stalls, candidate_stalls=b.stalls,
            baseline_claimed_tokens_per_s=a.tokens_per_s_per_device if choice.guard else None,
            candidate_claimed_tokens_per_s=b.tokens_per_s_per_device if choice.guard else None,
        ))
    return pairs


def own_aa(pairs: list[Pair]) -> list[float]:
    """A/A log ratios of the pairs' consecutive baseline runs."""
    return stats.aa_log_ratios([p.baseline_tokens_per_s for p in pairs])


def looks(settings: GuardConfig) -> list[int]:
    """The pairs measured by each look: ``speed.first_pairs``, then ``speed.pairs`` (one look when the
    first would be all of them)."""
    sp = settings.speed
    return [sp.first_pairs, sp.pairs] if 2 <= sp.first_pairs < sp.pairs else [sp.pairs]


def measure_speed(
    workload: Workload,
    baseline: Recipe,
    candidate: Recipe,
    settings: GuardConfig,
    out_dir: Path,
    prior_aa: list[float] | None = None,
    progress: Callable[[str], None] | None = None,
    prior_runs: list[RunResult] | None = None,
) -> SpeedEvidence:
    """Interleaved pairs of ``settings.speed.steps`` steps each, in looks (``looks``), up to
    ``settings.speed.pairs``. Each look decides on the trainer's printed times only where they agree with
    the guard's own clock (core/clock.py: ``choose``); else on the guard's clock, where the A/A noise of
    ``prior_runs`` (the profile's) is measured again on that clock in place of ``prior_aa``."""
    sp = settings.speed
    notes: list[str] = []
    plan = looks(settings)
    one_sided = (1 - sp.confidence) / 2  # the interval's lower end is a one-sided test at this level
    spending = Spending(one_sided, "pocock", spent("pocock", plan[0] / plan[-1], one_sided) / one_sided)

    def measured(runs: Runs) -> tuple[list[Pair], list[float], ClockChoice]:
        choice = clock.choose([a for a, _ in runs], [b for _, b in runs])
        pairs = timed(runs, choice)
        return pairs, own_aa(pairs), choice

    runs, failure = _pairs(workload, baseline, candidate, settings, out_dir, progress, 0, plan[0])
    pairs, aa, choice = measured(runs)
    if not failure and sp.noise_margin is None and stats.noise_margin(aa, 0.0) > sp.max_noise:
        notes.append(f"A/A noise {100 * stats.noise_margin(aa, 0.0):.0f}% over the first round of pairs is above "
                     f"speed.max_noise {100 * sp.max_noise:.0f}%: measured again")
        runs, failure = _pairs(workload, baseline, candidate, settings, out_dir / "again", progress, 0, plan[0])
        pairs, aa, choice = measured(runs)
    for k, n in enumerate(plan):
        if k:
            more, failure = _pairs(workload, baseline, candidate, settings, out_dir, progress, len(runs),
                                   n - len(runs))
            runs += more
            pairs, aa, choice = measured(runs)
        if failure:
            return _failed(pairs, failure, sp.confidence, notes)
        final = k == len(plan) - 1
        level = spending.look(n, n / plan[-1], final) if len(plan) > 1 else one_sided
        prior = prior_aa
        if choice.guard and prior_runs:  # the profile's A/A noise, on the clock this look decides on
            prior = stats.aa_log_ratios([choice.rate(r) for r in prior_runs])
        evidence = _judge(pairs, aa, prior, settings, 1 - 2 * level, notes)
        evidence.timed_by, evidence.clock = ("guard" if choice.guard else "trainer"), choice.note
        if len(plan) > 1:
            notes.append(_look_line(k, len(plan), n, level, evidence))
            if progress:
                progress(Note(notes[-1]))
        decided = evidence.busy or evidence.faster or (evidence.ci_high or 0) < 1 + evidence.noise_margin
        if final or decided:
            return evidence
    raise AssertionError("unreachable: the last look returns")


def _failed(pairs: list[Pair], failure: str, confidence: float, notes: list[str]) -> SpeedEvidence:
    """The evidence of pairs a failed run cut short: no speed-up, the failure said."""
    return SpeedEvidence(pairs=pairs, speedup=None, ci_low=None, ci_high=None, confidence=confidence,
                         ci_method="", noise_margin=0.0, noise_source="", aa_log_ratios=[], faster=False,
                         failure=failure, notes=notes)


def _look_line(k: int, looks: int, n: int, level: float, evidence: SpeedEvidence) -> str:
    """What look ``k`` (of ``looks``) at ``n`` pairs showed, tested at the one-sided ``level``."""
    verdict = ("clears the margin" if evidence.faster else "lies below the margin"
               if (evidence.ci_high or 0) < 1 + evidence.noise_margin else "cannot tell yet")
    return (f"speed look {k + 1}/{looks} ({n} pairs, {100 * (1 - 2 * level):.2f}% interval): "
            f"{evidence.speedup:.3f}x [{evidence.ci_low:.3f}, {evidence.ci_high:.3f}], margin "
            f"{100 * evidence.noise_margin:.1f}%: {verdict}")


def _judge(pairs: list[Pair], aa: list[float], prior_aa: list[float] | None, settings: GuardConfig,
           confidence: float, notes: list[str]) -> SpeedEvidence:
    """The speed-up of these pairs and its interval at ``confidence`` against the noise margin."""
    sp = settings.speed
    ratios = stats.log_ratios([p.candidate_tokens_per_s for p in pairs], [p.baseline_tokens_per_s for p in pairs])
    ci = stats.speedup_ci(ratios, confidence, sp.resamples, [*(prior_aa or []), *aa])
    own = stats.noise_margin(aa, 0.0)
    busy = ""
    if sp.noise_margin is None and own > sp.max_noise:
        busy = (f"the machine was busy: the A/A noise of the verdict's own pairs is {100 * own:.0f}%, above "
                f"speed.max_noise {100 * sp.max_noise:.0f}% even after measuring again; no decision on speed "
                "(rerun on a quiet machine)")
    aa = [*(prior_aa or []), *aa]
    if sp.noise_margin is not None:
        margin, source = sp.noise_margin, "configured"
    else:
        margin = stats.noise_margin(aa, sp.min_noise_margin)
        source = (f"A/A: RMS of {len(aa)} baseline-vs-baseline log ratios ({len(prior_aa or [])} from the profile, "
                  f"{len(aa) - len(prior_aa or [])} from these pairs), at least {sp.min_noise_margin:g}")
    return SpeedEvidence(
        pairs=pairs, speedup=ci.speedup, ci_low=ci.low, ci_high=ci.high, confidence=ci.confidence,
        ci_method=ci.method, noise_margin=margin, noise_source=source, aa_log_ratios=aa,
        faster=stats.clears(ci, margin) and not busy, busy=busy, notes=list(notes),
        smallest_approvable=stats.smallest_approvable(ratios, confidence, margin, aa),
    )
