"""The final decision on one candidate: APPROVED, REJECTED or KEEP BASELINE, with the evidence.

Static checks first (a violation rejects before anything runs), then loss parity over the seeds
(planned and gathered in looks, guard/looks.py: its runs go to the executor side by side, and are
stored under ``runs_folder`` for every later verdict against the same baseline), then interleaved
throughput on one placement. Every run has its own folder under ``out_dir`` (or a link there to the
stored run); the verdict is also written there as ``verdict.json`` for machines, with what it cost.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from recipetune.core import stats
from recipetune.core.filenames import VERDICT
from recipetune.core.files import write_atomic
from recipetune.core.fmt import fmt_duration
from recipetune.core.recipe import Recipe
from recipetune.core.words import Decision, ParityOutcome
from recipetune.execute.executor import Executor
from recipetune.guard.baseline import BaselineProfile, profile_baseline, trusted_aa
from recipetune.guard.config import GuardConfig
from recipetune.guard.looks import gather
from recipetune.guard.runs import Runs
from recipetune.guard.speed import SpeedEvidence, measure_speed
from recipetune.guard.static import StaticReport, static_report
from recipetune.workloads.base import Workload, tokens_per_step


class Verdict(BaseModel):
    decision: Decision
    reasons: list[str]
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    noise_margin: float | None = None
    confidence: float | None = None
    parity: dict[str, Any] = Field(default_factory=dict)  # ParityEvidence: gap, tolerance, finals, margin, p
    invariants_checked: list[str] = Field(default_factory=list)
    violations: list[dict[str, str]] = Field(default_factory=list)
    allowed_semantic: list[str] = Field(default_factory=list)
    pairs: list[dict[str, Any]] = Field(default_factory=list)  # the interleaved A/B measurements
    speed: dict[str, Any] = Field(default_factory=dict)  # noise source, A/A ratios, CI method
    baseline: dict[str, Any] = Field(default_factory=dict)
    candidate: dict[str, Any] = Field(default_factory=dict)
    change: str = ""
    notes: list[str] = Field(default_factory=list)  # how the evidence was gathered: mode, seeds, noise refused
    # what it cost: runs trained and seconds, per part; parity runs reused (stored by an earlier verdict)
    # and the runs the plan expected before the candidate ran, were its batches other than the baseline's
    cost: dict[str, float] = Field(default_factory=dict)
    stop: str = ""  # why the parity looks ended: decided, trend, futility, budget, plan, too short, failed
    # what parity covers: "parity shown over N steps (M tokens); the gap's slope over that window is s [lo, hi] per
    # 1,000 steps" (a verdict proves nothing beyond its horizon: docs/guard.md, "What a verdict proves")
    horizon: str = ""
    settings: dict[str, Any] = Field(default_factory=dict)
    out_dir: str = ""

    def save(self, path: Path) -> None:
        write_atomic(path, self.model_dump_json(indent=2))


def cost_text(cost: dict[str, float]) -> str:
    """What a verdict spent (``Verdict.cost``), in words; '' before anything ran. A verdict states its cost."""
    if not cost:
        return ""
    speed = f"; speed {cost['speed_runs']:.0f} runs, {fmt_duration(cost.get('speed_s'))}" \
        if "speed_runs" in cost else ""
    return (f"parity {cost.get('parity_runs', 0):.0f} run(s) trained, {cost.get('parity_reused', 0):.0f} reused, "
            f"{fmt_duration(cost.get('parity_s'))}{speed}")


def static_verdict(
    report: StaticReport, baseline: Recipe, candidate: Recipe, settings: GuardConfig, out_dir: str
) -> Verdict:
    """The verdict as far as the static checks go: REJECTED with the violations, else still undecided."""
    return Verdict(
        decision=Decision.REJECTED, reasons=[f"static check: {v}" for v in report.violations],
        invariants_checked=report.checked,
        violations=[{"knob": v.knob, "rule": v.rule, "message": v.message} for v in report.violations],
        allowed_semantic=report.allowed_semantic, baseline=dict(baseline), candidate=dict(candidate),
        change=candidate.describe_diff(baseline), settings=settings.model_dump(mode="json"), out_dir=out_dir,
    )


def final_verdict(
    workload: Workload,
    baseline: Recipe,
    candidate: Recipe,
    settings: GuardConfig,
    out_dir: Path,
    allow_semantic: Collection[str] = (),
    profile: BaselineProfile | None = None,
    progress: Callable[[str], None] | None = None,
    executor: Executor | None = None,
    runs_folder: Path | None = None,
) -> Verdict:
    """Decide on ``candidate``; raises ``baseline.GuardError`` when the baseline itself cannot be measured.

    ``executor``: where the runs go (default: this machine); the parity runs as separate units, the
    speed pairs as one. ``runs_folder``: where parity runs are stored and found again (None: each
    verdict trains its own)."""
    report = static_report(workload, baseline, candidate, allow_semantic)
    verdict = static_verdict(report, baseline, candidate, settings, str(out_dir))
    if report.violations:
        return _finish(verdict, out_dir)  # nothing ran

    runs = Runs(workload, executor, runs_folder, settings.timeout_s, progress)
    profile, prior_aa = _profile(verdict, workload, baseline, settings, out_dir, profile, progress, runs)

    # Parity: the candidate at every profiled seed, for the same tokens as the baseline.
    equal_tokens = bool(report.allowed_semantic)
    steps = profile.steps
    if equal_tokens:
        tb, tc = tokens_per_step(workload, baseline), tokens_per_step(workload, candidate)
        if tb and tc:
            steps = max(2, round(profile.steps * tb / tc))
    started = time.monotonic()
    got = gather(workload, profile, baseline, candidate, steps, settings, out_dir, equal_tokens, progress, runs)
    verdict.cost = {"parity_runs": got.runs, "parity_reused": got.reused, "parity_planned": got.planned,
                    "parity_s": round(time.monotonic() - started, 1)}
    verdict.stop = got.stop
    verdict.notes += runs.notes + got.looks  # stored runs not reused (what changed), results set aside
    evidence = got.evidence
    if evidence is None:
        verdict.reasons = [got.failure]
        return _finish(verdict, out_dir)
    verdict.parity = evidence.model_dump(mode="json")
    verdict.horizon = evidence.horizon()
    verdict.notes += [f"loss parity mode: {evidence.mode}, because {evidence.mode_reason}", *evidence.notes]
    if not evidence.passed:  # REJECTED when shown different; KEEP BASELINE when the runs cannot tell
        verdict.decision = Decision.REJECTED if evidence.outcome == ParityOutcome.FAILS else Decision.KEEP_BASELINE
        verdict.reasons = evidence.reasons
        return _finish(verdict, out_dir)

    # Throughput: interleaved pairs, the speed-up's CI against the noise margin.
    started = time.monotonic()
    if progress:
        progress(f"speed: {settings.speed.pairs} interleaved pairs of {settings.speed.steps} steps")
    if executor is None:
        speed = measure_speed(workload, baseline, candidate, settings, out_dir / "speed", prior_aa, progress,
                              profile.runs)
    else:  # one placement: its interleaved pairs must see the same hardware
        speed = executor.call(measure_speed, workload, baseline, candidate, settings, out_dir / "speed", prior_aa,
                              progress=progress, prior_runs=profile.runs).result()
    verdict.cost.update(speed_runs=2 * len(speed.pairs), speed_s=round(time.monotonic() - started, 1))
    _decide_speed(verdict, speed, f"loss parity holds ({evidence.summary()}); {evidence.horizon()}")
    return _finish(verdict, out_dir)


def _profile(
    verdict: Verdict, workload: Workload, baseline: Recipe, settings: GuardConfig, out_dir: Path,
    profile: BaselineProfile | None, progress: Callable[[str], None] | None, runs: Runs,
) -> tuple[BaselineProfile, list[float]]:
    """The baseline's profile and the A/A log ratios to trust. A campaign's profile serves when it measured
    this baseline at enough seeds for at least as many steps; otherwise the baseline is profiled again at
    the parity settings."""
    prior_aa: list[float] = []
    if profile is not None:
        prior_aa, refused = trusted_aa(profile, settings)
        verdict.notes += [n for n in (profile.noise_note, refused) if n]
    reusable = (profile is not None and profile.recipe == dict(baseline) and profile.steps >= settings.parity.steps
                and len(profile.runs) >= settings.parity.seeds)
    if not reusable:
        profile = profile_baseline(workload, baseline, settings.parity.steps, settings, out_dir / "baseline",
                                   progress, runs=runs)
        fresh, refused = trusted_aa(profile, settings)
        prior_aa += fresh
        verdict.notes += [n for n in (profile.noise_note, refused) if n]
    assert profile is not None
    return profile, prior_aa


def _decide_speed(verdict: Verdict, speed: SpeedEvidence, loss: str) -> None:
    """The decision once parity holds: APPROVED only when the speed-up's CI clears 1 + the noise margin."""
    verdict.pairs = [p.model_dump(mode="json") for p in speed.pairs]
    verdict.speed = speed.model_dump(mode="json", exclude={"pairs"})
    verdict.notes += speed.notes
    if speed.clock:
        verdict.notes.append(f"speed timed by {speed.clock}")
    if speed.failure:
        verdict.reasons = [speed.failure]
        return
    stalls = sum(p.baseline_stalls + p.candidate_stalls for p in speed.pairs)
    if stalls:
        verdict.notes.append(f"{stalls} stalled step(s) in the speed runs, outweighed by each run's median over "
                             "windows (see pairs)")
    verdict.speedup, verdict.ci_low, verdict.ci_high = speed.speedup, speed.ci_low, speed.ci_high
    verdict.noise_margin, verdict.confidence = speed.noise_margin, speed.confidence
    power = (f"; the smallest speed-up these pairs could approve: {speed.smallest_approvable:.3f}x"
             if speed.smallest_approvable else "")
    claimed = ""
    if speed.timed_by == "guard" and all(p.candidate_claimed_tokens_per_s for p in speed.pairs):
        said = stats.log_ratios([p.candidate_claimed_tokens_per_s or 0.0 for p in speed.pairs],
                                [p.baseline_claimed_tokens_per_s or 0.0 for p in speed.pairs])
        claimed = (f" on the guard's own clock (the trainer's printed step times say "
                   f"{math.exp(statistics.fmean(said)):.3f}x; they disagree with the guard's clock)")
    figures = (f"speed-up {speed.speedup:.3f}x{claimed}, {100 * speed.confidence:.0f}% CI [{speed.ci_low:.3f}, "
               f"{speed.ci_high:.3f}] over {len(speed.pairs)} interleaved pairs; noise margin "
               f"{100 * speed.noise_margin:.1f}%{power}")
    if speed.busy:
        verdict.decision, verdict.reasons = Decision.KEEP_BASELINE, [speed.busy, loss]
    elif speed.faster:
        verdict.decision = Decision.APPROVED
        verdict.reasons = [f"{figures}: the CI's lower end clears 1 + margin", loss]
    else:
        verdict.decision = Decision.KEEP_BASELINE
        why = "the candidate is slower" if speed.ci_high < 1 else "the gain is within noise"
        verdict.reasons = [f"{figures}: the CI's lower end {speed.ci_low:.3f} does not clear "
                           f"{1 + speed.noise_margin:.3f}, {why}", loss]


def _finish(verdict: Verdict, out_dir: Path) -> Verdict:
    out_dir.mkdir(parents=True, exist_ok=True)
    verdict.save(out_dir / VERDICT)
    return verdict
