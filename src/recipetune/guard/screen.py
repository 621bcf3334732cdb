"""The quick check of one search trial: one run, with the baseline's seed, against the profile.

Cheap on purpose (the trial's own run is the only measurement): a candidate that already trains
differently at the baseline's seed is dropped from the search; throughput is compared with the
profile's median, and only the final verdict re-measures it interleaved.
"""

from __future__ import annotations

import statistics

from pydantic import BaseModel

from recipetune.core import clock
from recipetune.core.measure import RunResult
from recipetune.core.words import ParityOutcome
from recipetune.guard.baseline import BaselineProfile
from recipetune.guard.config import GuardConfig
from recipetune.guard.parity import compare, semantic_edits


class Screening(BaseModel):
    passed: bool
    reasons: list[str]  # why it failed (empty when passed)
    speedup: float | None  # candidate tokens/s per device / baseline's
    loss_gap: float | None  # the parity statistic: the candidate's loss measure minus the baseline's (nats)
    loss_tolerance: float | None  # T
    mode: str = "same batches"  # how the evidence was gathered (guard/parity.py)
    clock: str = ""  # where the speed-up is on the guard's own clock: why (the trainer's times disagree)


def screen(profile: BaselineProfile, candidate: RunResult, settings: GuardConfig) -> Screening:
    if not candidate.ok:
        return Screening(passed=False, reasons=[f"run {candidate.status}: {candidate.cause}"], speedup=None,
                         loss_gap=None, loss_tolerance=None)
    speedup, clock_note = speed_against(profile, candidate)
    seed = candidate.recipe.get("seed")
    if profile.seeds[0] is not None and seed != profile.seeds[0]:
        return Screening(passed=False, reasons=[f"ran with seed {seed}, the baseline profile with "
                                                f"{profile.seeds[0]}: no same-seed comparison possible"],
                         speedup=speedup, loss_gap=None, loss_tolerance=None)
    semantic = bool(semantic_edits(profile, candidate.recipe))
    evidence = compare(profile, [candidate], settings.parity, equal_tokens=semantic)
    # A screening run that cannot resolve T goes on: only the final verdict, with its looks, may
    # approve, and it never approves what it cannot tell.
    return Screening(
        passed=evidence.outcome != ParityOutcome.FAILS,
        reasons=evidence.reasons if evidence.outcome == ParityOutcome.FAILS else [],
        speedup=speedup,
        loss_gap=evidence.mean_diff,
        loss_tolerance=evidence.tolerance,
        mode=evidence.mode,
        clock=clock_note,
    )


def speed_against(profile: BaselineProfile, candidate: RunResult) -> tuple[float | None, str]:
    """The candidate's tokens/s per device over the profile's, on the trainer's printed times where they
    agree with the guard's own clock, else on the guard's clock for both (core/clock.py: ``choose``;
    then the note says why)."""
    choice = clock.choose(profile.runs, [candidate])
    if not choice.guard and profile.timed_by == "trainer":
        base = profile.tokens_per_s  # possibly measured again on quieter runs (baseline.remeasure_throughput)
    else:
        base = statistics.median(choice.rate(r) for r in profile.runs)
    return (choice.rate(candidate) / base if base > 0 else None), (choice.note if choice.guard else "")
